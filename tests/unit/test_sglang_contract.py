"""The SGLang API the project calls, checked against the pinned version's recorded signatures.

tests/data/sglang_signatures.json is recorded from the sglang wheels' sources
(tests/support/record_sglang_signatures.py). These tests check that (a) the fake engine's methods,
server arguments and sampling keys are the pinned version's, and (b) the calls one RL step makes
through the real backend code (rollout/sglang_engine.py) bind to those signatures, with the types
they declare, in the order the colocated memory protocol needs. A version bump that changes any of
it fails here instead of on the first GPU run.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

from harness import fake_sglang
from tests.support.threads import one_thread  # noqa: F401  (autouse)
from vepo_mcore.rollout.base import SamplingParams
from vepo_mcore.rollout.sglang_engine import trainer_process_state_kept

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "sglang_signatures.json").read_text())
PINNED = fake_sglang.SGLANG_VERSION
INTERNAL_SAMPLING_FIELDS = {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                            "is_normalized", "ebnf_full_assistant"}  # fmt: skip
ALL = ["kv_cache", "weights", "cuda_graph"]


def _recorded_signature(version: str, method: str) -> inspect.Signature:
    kinds = {"positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
             "keyword_only": inspect.Parameter.KEYWORD_ONLY, "var_keyword": inspect.Parameter.VAR_KEYWORD}  # fmt: skip
    params = []
    for p in RECORDED[version]["engine_methods"][method]:
        default = (
            inspect.Parameter.empty if p.get("required") or p["kind"] == "var_keyword" else p.get("default")
        )
        params.append(inspect.Parameter(p["name"], kinds[p["kind"]], default=default))
    return inspect.Signature(params)


def _types(annotation: str) -> set[type]:
    """'Optional[float]' -> {float, NoneType}: the scalar annotations ServerArgs uses for our fields."""
    names = {"str": str, "int": int, "float": float, "bool": bool, "None": type(None)}
    inner = annotation.removeprefix("Optional[").removesuffix("]")
    out = {names[t.strip()] for t in inner.split(",")}
    return out | ({type(None)} if annotation.startswith("Optional[") else set())


# ----------------------------------------------------------------------------- the fake is the pinned API


@pytest.mark.parametrize("version", sorted(fake_sglang.FAKE_ENGINES))
def test_fake_engine_methods_are_the_recorded_ones(version):
    cls = fake_sglang.FAKE_ENGINES[version]
    recorded = RECORDED[version]["engine_methods"]
    for method in ("begin_weight_update", "end_weight_update"):
        # 0.5.23 has a weight-update session, 0.5.15.post1 has none: the fake must match either way.
        assert (method in recorded) == cls.weight_update_session, (version, method)
    for method, params in recorded.items():
        if method == "__init__":
            assert [p["kind"] for p in params] == ["var_keyword"]  # Engine(**kwargs) -> ServerArgs(**kwargs)
            continue
        ours = inspect.signature(getattr(cls, method))
        names = [n for n, p in ours.parameters.items() if n != "self" and p.kind != p.VAR_KEYWORD]
        if method == "generate":
            names += list(fake_sglang.GENERATE_EXTRA)
            if version != PINNED:
                continue  # the fake's generate is 0.5.23's; the backend passes only names both have
        assert sorted(names) == sorted(p["name"] for p in params), method
        for p in params:  # same defaults where both spell one out
            if "default" in p and p["name"] in ours.parameters:
                assert repr(ours.parameters[p["name"]].default) == p["default"], (method, p["name"])


def test_fake_server_args_sampling_keys_and_tags_are_the_recorded_ones():
    rec = RECORDED[PINNED]
    assert set(fake_sglang.SERVER_ARGS) == set(rec["server_args"])
    for name, annotation in rec["server_args"].items():
        assert set(fake_sglang.SERVER_ARGS[name]) == _types(annotation), name
    assert set(fake_sglang.SAMPLING_KEYS) == set(rec["sampling_params"]) - INTERNAL_SAMPLING_FIELDS
    assert list(fake_sglang.MEMORY_TAGS) == rec["memory_tags"]


# ----------------------------------------------------------------------------- the backend's calls


def _backend(tmp_path, version=PINNED, engine_tp=1, deterministic=True):
    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.checkpoint.hf import model_config_from_hf, read_hf_config
    from vepo_mcore.config import JobConfig
    from vepo_mcore.rollout.sglang_engine import SGLangEngine

    hf_model = tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=1)
    cfg = JobConfig()
    cfg.model = model_config_from_hf(read_hf_config(tmp_path / "hf"))
    cfg.rl.rollout.engine_tp = engine_tp
    cfg.rl.rollout.deterministic_inference = deterministic
    engine = SGLangEngine(
        cfg, fake_sglang.fake_backend(version), name="fake_sglang"
    )  # colocated: no model_path
    weights = [(k, v.detach().clone()) for k, v in hf_model.state_dict().items()]
    return engine, weights


def _one_rl_step(engine, weights):
    """What RLTrainer.generate does around one rollout: wake, sync, generate (seeded), sleep."""
    engine.wake()
    engine.update_weights(weights, bucket_bytes=1 << 14)
    engine.generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=0.9, max_new_tokens=3, seed=7))
    engine.sleep()


@pytest.mark.parametrize("version", sorted(fake_sglang.FAKE_ENGINES))
def test_one_rl_step_calls_sglang_in_the_colocated_order_with_recorded_signatures(tmp_path, version):
    engine, weights = _backend(tmp_path, version)
    fake = engine.engine
    _one_rl_step(engine, weights)
    engine.shutdown()
    names = [name for name, _ in fake.calls]
    session = ["begin_weight_update"] if version == PINNED else []
    end = ["end_weight_update"] if version == PINNED else []
    pushes = names.count("update_weights_from_tensor")
    assert pushes > 1
    assert names == [
        "__init__",
        "flush_cache", "release_memory_occupation",            # released right after the build (slime)
        "resume_memory_occupation",                             # wake: weights only
        *session, *["update_weights_from_tensor"] * pushes, *end, "flush_cache",  # the sync
        "resume_memory_occupation",                             # kv_cache + cuda_graph after the sync
        "generate",
        "flush_cache", "release_memory_occupation",             # sleep: idle first, then release
        "shutdown",
    ]  # fmt: skip
    resumes = [kw["tags"] for name, kw in fake.calls if name == "resume_memory_occupation"]
    assert resumes == [["weights"], ["kv_cache", "cuda_graph"]]
    releases = [kw["tags"] for name, kw in fake.calls if name == "release_memory_occupation"]
    assert releases == [ALL, ALL]

    # Every call binds to the recorded signature of this version, with the types it declares.
    init_kwargs = fake.calls[0][1]
    rec_args = RECORDED[version]["server_args"]
    for name, value in init_kwargs.items():
        assert name in rec_args, f"Engine({name}=...) is not a ServerArgs field of sglang {version}"
        assert type(value) in _types(rec_args[name]), (name, value)
    for name, kwargs in fake.calls[1:]:
        _recorded_signature(version, name).bind(**kwargs)
    for name, kwargs in fake.calls:
        if name == "generate":
            assert set().union(*kwargs["sampling_params"]) <= set(RECORDED[version]["sampling_params"])
        if name == "update_weights_from_tensor":
            assert kwargs["load_format"] == "flattened_bucket" and kwargs["flush_cache"] is False
        if name.endswith("memory_occupation"):
            assert set(kwargs["tags"]) <= set(RECORDED[version]["memory_tags"])


# ----------------------------------------------------------------------------- the fake refuses what SGLang refuses


def _fake(tmp_path, **server_args):
    from tests.support.checkpoints import tiny_qwen2_hf

    tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=1)
    with trainer_process_state_kept():  # the fake configures the process as SGLang does
        return fake_sglang.FakeSGLangEngine(
            model_path=str(tmp_path / "hf"), enable_memory_saver=True, **server_args
        )


def test_resume_without_a_release_raises_keyerror_as_sglang_scheduler(tmp_path):
    # sglang 0.5.15.post1 / 0.5.23 scheduler: `self.offload_tags.remove(tag)` on a tag never released.
    fake = _fake(tmp_path)
    with pytest.raises(KeyError, match="kv_cache"):
        fake.resume_memory_occupation()  # tags=None = all, kv_cache first
    with pytest.raises(KeyError, match="weights"):
        fake.resume_memory_occupation(tags=["weights"])
    fake.release_memory_occupation(tags=["weights"])
    fake.resume_memory_occupation(tags=["weights"])
    with pytest.raises(KeyError, match="weights"):
        fake.resume_memory_occupation(tags=["weights"])


def test_first_wake_of_a_colocated_engine_resumes_what_was_released(tmp_path):
    """Issue 20.1: the first RL step called resume before anything was released."""
    engine, weights = _backend(tmp_path)
    assert engine.released == set(ALL) and engine.engine.offload_tags == set(ALL)
    engine.wake()  # would raise KeyError('kv_cache') on an engine that was never released
    assert engine.engine.offload_tags == {"kv_cache", "cuda_graph"}
    engine.engine.resume_memory_occupation(tags=["kv_cache", "cuda_graph"])
    with pytest.raises(RuntimeError, match="weights were released"):  # weights back, contents not yet
        engine.engine.generate(input_ids=[[1, 2]], sampling_params={"max_new_tokens": 1})


def test_fake_refuses_unknown_or_mistyped_server_args_and_sampling_keys(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'tensor_parallel_size'"):
        _fake(tmp_path, tensor_parallel_size=2)
    with pytest.raises(TypeError, match="ServerArgs.tp_size must be int"):
        _fake(tmp_path, tp_size="2")
    with pytest.raises(TypeError, match="enable_deterministic_inference must be bool"):
        _fake(tmp_path, enable_deterministic_inference=1)
    with pytest.raises(
        ValueError, match="deterministic inference, but you explicitly specified 'torch_native'"
    ):
        _fake(tmp_path, enable_deterministic_inference=True, attention_backend="torch_native")
    fake = _fake(tmp_path)
    with pytest.raises(TypeError, match="seed"):
        fake.generate(input_ids=[[1, 2]], sampling_params={"seed": 3})  # SGLang's key is sampling_seed
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_tokens'"):
        fake.generate(input_ids=[[1, 2]], max_tokens=3)
    with pytest.raises(ValueError, match="memory tags"):
        fake.release_memory_occupation(tags=["kv"])


def test_weights_load_only_inside_a_session_on_the_pinned_version(tmp_path):
    fake = _fake(tmp_path)
    tensor = [
        ("model.norm.weight", torch.ones(dict(fake.model.named_parameters())["model.norm.weight"].shape))
    ]
    ok, message = fake.update_weights_from_tensor(tensor)
    assert not ok and "begin_weight_update" in message
    assert fake.begin_weight_update() == (True, "Success")
    assert fake.update_weights_from_tensor(tensor) == (True, "Success")
    assert fake.end_weight_update() == (True, "Success")
    with trainer_process_state_kept():
        old = fake_sglang.FakeSGLangEngine0515(model_path=fake.server_args["model_path"])
    assert not hasattr(old, "begin_weight_update")
    assert old.update_weights_from_tensor(tensor) == (True, "Success")


def test_one_payload_per_engine_tp_rank_and_reductions_patched(tmp_path, monkeypatch):
    """Issue 20.6: every engine TP rank deserialises its own payload; one shared payload fails."""
    monkeypatch.setattr(fake_sglang.MultiprocessingSerializer, "reductions_patched", False)
    engine, weights = _backend(tmp_path, engine_tp=2)
    fake = engine.engine
    engine.wake()
    engine.update_weights(weights, bucket_bytes=1 << 14)  # two distinct handles per bucket
    assert fake_sglang.MultiprocessingSerializer.reductions_patched
    bucket = fake_sglang.FlattenedTensorBucket(named_tensors=weights[:1])
    payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
    shared = fake_sglang.MultiprocessingSerializer.serialize(payload, output_str=True)
    fake.begin_weight_update()
    with pytest.raises(ValueError, match="already consumed"):
        fake.update_weights_from_tensor([shared, shared], load_format="flattened_bucket")
    with pytest.raises(IndexError, match="tp_size=2"):
        fake.update_weights_from_tensor([shared], load_format="flattened_bucket")


def _samples(engine, seed):
    params = SamplingParams(temperature=2.0, max_new_tokens=12, seed=seed)
    return [s.response_ids for s in engine.generate([[5, 6, 7], [8, 9]], params)]


@pytest.mark.parametrize("deterministic", [True, False])
def test_sampling_seed_takes_effect_only_with_deterministic_inference(tmp_path, deterministic):
    """Issue 20.4: SGLang ignores sampling_seed unless enable_deterministic_inference is on; the config
    (rl.rollout.deterministic_inference, default on) turns it on so seeded rollouts reproduce."""
    engine, weights = _backend(tmp_path, deterministic=deterministic)
    assert engine.engine.server_args["enable_deterministic_inference"] is deterministic
    engine.wake()
    engine.update_weights(weights)
    first, again = _samples(engine, seed=3), _samples(engine, seed=3)
    assert (first == again) is deterministic


def test_sleep_waits_until_flush_succeeds_then_releases(tmp_path, monkeypatch):
    """Issue 20.8: SGLang releases only an idle engine (it asserts); flush_cache succeeds only then."""
    from vepo_mcore.rollout import sglang_engine

    engine, weights = _backend(tmp_path)
    engine.wake()
    engine.update_weights(weights)
    fake = engine.engine
    answers = iter([False, False, True])
    flush = fake.flush_cache
    monkeypatch.setattr(fake, "flush_cache", lambda: fake_sglang.FlushCacheReqOutput(success=next(answers)))
    monkeypatch.setattr(sglang_engine.time, "sleep", lambda s: None)
    engine.sleep()
    assert next(answers, "done") == "done" and fake.offload_tags == set(ALL)
    monkeypatch.setattr(fake, "flush_cache", lambda: fake_sglang.FlushCacheReqOutput(success=False))
    engine.wake()
    engine.update_weights(weights)
    monkeypatch.setattr(fake, "flush_cache", lambda: fake_sglang.FlushCacheReqOutput(success=False))
    with pytest.raises(RuntimeError, match="stayed busy"):
        engine.sleep()
    assert "release_memory_occupation" != fake.calls[-1][0]  # never released a busy engine
    monkeypatch.setattr(fake, "flush_cache", flush)


def test_wait_until_settled_returns_once_free_memory_stops_rising():
    from vepo_mcore.rollout.sglang_engine import wait_until_settled

    readings = iter([10, 40, 70, 90, 90, 90, 90, 90])
    slept = []
    assert wait_until_settled(lambda: next(readings), sleep=slept.append, interval=0.1) == 90
    assert len(slept) == 6  # rose three times, then three steady readings
    with pytest.warns(UserWarning, match="still changing"):
        counter = iter(range(10**6))
        wait_until_settled(lambda: next(counter), sleep=lambda s: None, interval=1.0, timeout=5.0)


def test_building_the_engine_leaves_the_trainers_process_state_as_it_was(tmp_path, monkeypatch):
    """sglang 0.5.23's Engine(...) sets NCCL/CUDA variables, forces the root logger to ERROR and the
    spawn start method in the process that builds it (the fake does the same); only engine owners
    build one, so build_engine must hand the trainer its own state back."""
    import logging
    import multiprocessing
    import os

    from tests.dist.model_utils import tiny_cfg
    from vepo_mcore.rollout.base import build_engine

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # what Megatron's TP overlap wants
    for name in ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "SGLANG_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    ours = logging.StreamHandler()
    monkeypatch.setattr(root, "handlers", [*root.handlers, ours])
    monkeypatch.setattr(root, "level", logging.INFO)
    start_method = multiprocessing.get_start_method(allow_none=True)
    environ, handlers = dict(os.environ), root.handlers[:]

    cfg = tiny_cfg(num_layers=1)
    cfg.rl.rollout.engine = "fake_sglang"
    cfg.rl.rollout.engine_tp = 2  # deterministic inference at TP > 1: SGLang pins NCCL's algorithm
    engine = build_engine(cfg)
    try:
        assert engine.engine.server_args["enable_deterministic_inference"] is True
        assert dict(os.environ) == environ
        assert root.handlers == handlers and root.level == logging.INFO
        assert ours.stream is not None and not getattr(ours, "_closed", False)
        assert multiprocessing.get_start_method(allow_none=True) == start_method
    finally:
        engine.shutdown()


# ----------------------------------------------------------------------------- sync and seeds


def test_request_seeds_never_collide_across_replicas_or_requests(tmp_path):
    """One engine serves every replica's requests at once; the trainer seeds each replica's call
    with step_seed * 64 + replica, so `seed + i` per request collided (replica 0's request 1 ==
    replica 1's request 0)."""
    engine, _ = _backend(tmp_path)
    step_seed = 1234 * 64
    seeds = [
        p["sampling_seed"]
        for replica in range(4)
        for p in engine._sampling_params(SamplingParams(seed=step_seed + replica), 300, replica)
    ]
    assert len(set(seeds)) == len(seeds) == 4 * 300
    assert all(0 <= s < 2**63 for s in seeds)  # SGLang's sampling_seed is an int64
    engine.shutdown()


def test_payloads_are_freed_before_the_kv_cache_comes_back(tmp_path, monkeypatch):
    """CUDA IPC payloads the engine has loaded are collected and the cache emptied before the KV
    cache is resumed (slime does the same), so the KV cache gets that memory."""
    engine, weights = _backend(tmp_path)
    fake = engine.engine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("ipc_collect", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda name=name: fake.calls.append((f"cuda.{name}", {})))
    engine.wake()
    engine.update_weights(weights, bucket_bytes=1 << 14)
    engine.generate([[5, 6, 7]], SamplingParams(temperature=0.9, max_new_tokens=2, seed=7))
    names = [name for name, _ in fake.calls]
    resume_kv = max(i for i, (name, kw) in enumerate(fake.calls) if name == "resume_memory_occupation")
    assert "kv_cache" in fake.calls[resume_kv][1]["tags"]
    assert names[resume_kv - 2 : resume_kv] == ["cuda.ipc_collect", "cuda.empty_cache"]
    assert names.index("cuda.ipc_collect") > max(
        i for i, n in enumerate(names) if n == "update_weights_from_tensor"
    )
    monkeypatch.undo()
    engine.shutdown()


def test_each_engine_tp_rank_gets_its_payload_on_its_own_gpu(tmp_path, monkeypatch):
    """Engine TP rank k computes on GPU base_gpu_id + k: its payload is copied there, not left on the
    owner's GPU for every engine rank to read across (sglang PR 12664's illegal memory accesses)."""
    engine, weights = _backend(tmp_path, engine_tp=2)
    engine.engine_base_gpu = 4
    assert engine.engine_device(1, torch.device("cuda", 4)) == torch.device("cuda", 5)
    assert engine.engine_device(1, torch.device("cpu")) == torch.device("cpu")  # no GPU: stays
    asked = []
    real = engine.engine_device
    monkeypatch.setattr(engine, "engine_device", lambda k, default: (asked.append(k), real(k, default))[1])
    engine.wake()
    engine.update_weights(weights, bucket_bytes=1 << 14)
    buckets = engine.last_sync["calls"]
    assert asked == [0, 1] * buckets
    engine.shutdown()
