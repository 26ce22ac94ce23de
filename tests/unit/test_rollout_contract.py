"""The rollout-engine contract, and the SGLang backend run against the fake sglang.Engine.

`run_contract` is the one suite every engine passes: here against SGLangEngine over the fake
(reference: transformers' full forward, no cache), in tests/dist against the embedded engine
(reference: the Megatron model's full forward) and in tests/gpu against real SGLang.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.support.threads import one_thread  # noqa: F401  (autouse)
from vepo_mcore.rollout.base import SamplingParams
from vepo_mcore.translation.sample import Sample

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


def run_contract(engine, reference, weights: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    """reference(prompt_ids, response_ids, tau) -> per-token log softmax(z / tau) over the real vocab
    (tau = 1 for greedy) from a full forward; weights: the engine's current HF weights."""
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    # A colocated engine may start released (SGLang): wake it and push the policy, as the trainer does.
    engine.wake()
    if not engine.weights_survive_sleep:
        engine.update_weights(list(weights.items()))
    prompts = [
        Sample(prompt_ids=list(p), src_lang="en", tgt_lang="th", group_id=i) for i, p in enumerate(PROMPTS)
    ]
    first = engine.generate(prompts, greedy)

    # shapes, order, untouched inputs
    assert len(first) == len(PROMPTS)
    for i, s in enumerate(first):
        assert s.prompt_ids == PROMPTS[i] and s.group_id == i and s.direction == "en-th"
        assert len(s.response_ids) == len(s.rollout_logprobs) == 6
        assert s.finish_reason == "length"
    assert all(p.response_ids == [] for p in prompts), "generate must not modify its inputs"

    # greedy log-probs are log softmax(z) of the argmax
    for s in first:
        ref = reference(s.prompt_ids, s.response_ids, 1.0)
        assert torch.allclose(torch.tensor(s.rollout_logprobs), torch.tensor(ref), atol=atol), (s, ref)

    # stop tokens: sample 0 stops on its first greedy token; the others stop there or run to length
    stop = first[0].response_ids[0]
    stopped = engine.generate(PROMPTS, replace(greedy, stop_token_ids=(stop,)))
    assert stopped[0].response_ids == [stop] and stopped[0].finish_reason == "stop"
    for s, full in zip(stopped, first):
        if stop in full.response_ids:
            cut = full.response_ids.index(stop) + 1
            assert s.response_ids == full.response_ids[:cut] and s.finish_reason == "stop"
        else:
            assert s.response_ids == full.response_ids and s.finish_reason == "length"

    # tempered sampling: log-probs are the training model's log softmax(z / tau); seeded = reproducible
    sampling = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, max_new_tokens=6, seed=11)
    sampled = engine.generate(PROMPTS, sampling)
    for s in sampled:
        ref = reference(s.prompt_ids, s.response_ids, 0.8)
        assert torch.allclose(torch.tensor(s.rollout_logprobs), torch.tensor(ref), atol=atol), (s, ref)
    again = engine.generate(PROMPTS, sampling)
    assert [s.response_ids for s in again] == [s.response_ids for s in sampled]

    # sleep / wake keeps (or, after a re-push, restores) the policy
    engine.sleep()
    engine.wake()
    if not engine.weights_survive_sleep:
        engine.update_weights(list(weights.items()))
    assert [s.response_ids for s in engine.generate(PROMPTS, greedy)] == [s.response_ids for s in first]

    # update_weights changes the outputs; pushing the old weights back restores them
    norm = weights["model.norm.weight"].clone()
    engine.update_weights([("model.norm.weight", -norm)])
    flipped = engine.generate(PROMPTS, greedy)
    assert [s.response_ids for s in flipped] != [s.response_ids for s in first]
    engine.update_weights([("model.norm.weight", norm.clone())])
    restored = engine.generate(PROMPTS, greedy)
    assert [s.response_ids for s in restored] == [s.response_ids for s in first]
    for a, b in zip(restored, first):
        assert torch.allclose(torch.tensor(a.rollout_logprobs), torch.tensor(b.rollout_logprobs), atol=atol)


def hf_reference(model, vocab_size: int):
    """Log-probs of `response` after `prompt` from a full (cache-free) transformers forward."""

    def reference(prompt_ids, response_ids, tau):
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1, :vocab_size].double()
        logp = torch.log_softmax(logits / tau, dim=-1)
        return logp.gather(-1, torch.tensor(response_ids)[:, None])[:, 0].tolist()

    return reference


# ----------------------------------------------------------------------------- fake SGLang


def _fake_setup(tmp_path, vocab_rows=320, vocab_size=320, tie=False):
    from harness.fake_sglang import fake_backend
    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.checkpoint.hf import model_config_from_hf, read_hf_config
    from vepo_mcore.config import JobConfig
    from vepo_mcore.rollout.sglang_engine import SGLangEngine

    hf_model = tiny_qwen2_hf(tmp_path / "hf", tie=tie, vocab_size=vocab_rows, num_layers=2)
    cfg = JobConfig()
    cfg.model = model_config_from_hf(read_hf_config(tmp_path / "hf"), vocab_size=vocab_size)
    engine = SGLangEngine(cfg, fake_backend(), model_path=tmp_path / "hf", name="fake_sglang", colocated=True)
    weights = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    engine.wake()  # released at start, as colocated with training: weights back, then pushed
    engine.update_weights(list(weights.items()))
    return engine, hf_model, weights


def test_contract_fake_sglang(tmp_path):
    engine, hf_model, weights = _fake_setup(tmp_path)
    run_contract(engine, hf_reference(hf_model, 320), weights)
    engine.shutdown()


def test_padding_rows_are_never_sampled_and_leave_logprobs_alone(tmp_path):
    # HF rows 320 > real vocab 250: the engine must behave as if the vocabulary had 250 entries.
    engine, hf_model, _ = _fake_setup(tmp_path, vocab_rows=320, vocab_size=250)
    with torch.no_grad():  # make the padding rows attractive, so a missing mask would show
        hf_model.lm_head.weight[250:] *= 5.0
    engine.update_weights([("lm_head.weight", hf_model.lm_head.weight.detach().clone())])
    samples = engine.generate(PROMPTS, SamplingParams(temperature=3.0, max_new_tokens=20, seed=1))
    reference = hf_reference(hf_model, 250)
    for s in samples:
        assert max(s.response_ids) < 250
        ref = torch.tensor(reference(s.prompt_ids, s.response_ids, 3.0))
        assert torch.allclose(torch.tensor(s.rollout_logprobs), ref.float(), atol=1e-5)


def test_bucketed_and_per_tensor_pushes_load_the_same_weights(tmp_path):
    engine, hf_model, weights = _fake_setup(tmp_path)
    new = {k: v + 0.01 * torch.randn_like(v) for k, v in weights.items()}
    model_bytes = sum(v.numel() * v.element_size() for v in new.values())
    for bucket_bytes in (0, 4096, 1 << 30):
        engine.wake()
        fake = engine.engine
        before = fake.bytes_received
        engine.update_weights(list(new.items()), bucket_bytes=bucket_bytes)
        assert fake.bytes_received - before == model_bytes == engine.last_sync["bytes"]
        assert engine.last_sync["calls"] == {0: len(new), 1 << 30: 1}.get(
            bucket_bytes, engine.last_sync["calls"]
        )
        for name, value in new.items():
            assert torch.equal(dict(fake.model.named_parameters())[name], value), name
        engine.sleep()
    # one flush per sync (not per bucket) and one before each release; _fake_setup synced once
    assert engine.engine.flush_calls == 2 + 3 + 3


def test_released_engine_refuses_to_generate_until_weights_return(tmp_path):
    engine, _, weights = _fake_setup(tmp_path)
    engine.sleep()
    with pytest.raises(RuntimeError, match="sleeps"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match="wake"):
        engine.update_weights(list(weights.items()))
    engine.wake()
    with pytest.raises(RuntimeError, match="push them again"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    engine.update_weights(list(weights.items()))
    assert len(engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))) == 3


def test_fake_rejects_unknown_or_misshaped_weights(tmp_path):
    engine, _, weights = _fake_setup(tmp_path)
    with pytest.raises(ValueError, match="unknown parameter"):
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", weights["model.norm.weight"])])
    with pytest.raises(AssertionError, match="Attempted to load weight"):  # sglang's default_weight_loader
        engine.update_weights([("model.norm.weight", torch.zeros(3))])


def test_fake_output_structure_matches_sglang(tmp_path):
    engine, _, _ = _fake_setup(tmp_path)
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=1))  # resumes the KV cache, as in a step
    out = engine.engine.generate(
        input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 3, "temperature": 0.0}, return_logprob=True
    )
    meta = out[0]["meta_info"]
    assert set(out[0]) == {"output_ids", "meta_info"}  # skip_tokenizer_init: ids only, like SGLang
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert meta["completion_tokens"] == 3 and meta["prompt_tokens"] == 3
    assert [tok for _, tok, _ in meta["output_token_logprobs"]] == out[0]["output_ids"]
    single = engine.engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
    assert isinstance(single, dict)
