"""Resize a model's embeddings for an expanded tokenizer: Megatron checkpoints (any TP/PP) and HF
directories (SPEC section 1). The row rule itself lives in tokenizer/embedding_rows.py; this module moves tensors.

    # Megatron: collective, one process per rank of the layout (tools/resize_embeddings.py spawns them)
    resize_megatron_checkpoint("ckpt/qwen7b", "ckpt/qwen7b-expanded", "out/qwen2.5-expanded")
    # HF: one process, tensors streamed one at a time
    resize_hf_checkpoint("Qwen2.5-7B", "Qwen2.5-7B-expanded", "out/qwen2.5-expanded")

Megatron: the new model (model.vocab_size = the expanded tokenizer's length) is built at the
configured TP/PP; every non-vocab tensor is loaded from the old checkpoint into it; the word
embeddings (first stage) and output layer (last stage; with tied embeddings on PP > 1 the last
stage's copy of the embedding) are read whole (global [old_rows, h]: torch_dist stores global
tensors, so this is the TP gather), resized by `resize_embedding` to the padded row count of the
one padding rule at this TP, and this rank's TP slice of rows is kept. Reading the whole tensor
instead of loading the old model means an old checkpoint whose padding differs at this TP still
loads. The result is a weights-only checkpoint (iteration 0) whose config.yaml has
model.vocab_size = the new vocab and tokenizer.path = the expanded directory, with the expanded
tokenizer copied beside it (and an hf_config.json with the new row count when the source had one,
so export writes a matching config.json).

HF: model.embed_tokens.weight and lm_head.weight (absent when tie_word_embeddings) are resized;
config.json's vocab_size becomes the new row count, padded_vocab_size(new_vocab, 128, 1) by
default: a multiple of 128 like Megatron's rule at TP=1 (transformers itself needs no padding;
Qwen2.5's 152,064 is the rule at TP=4). Tokenizer files come from the expanded directory, never
from the source (its vocab.json/merges.txt would describe the base vocabulary).

Continued pre-training on the expanded tokenizer needs nothing else: data tokenized with it, and the
resized checkpoint loaded with tokenizer.path = the expanded directory and model.vocab_size = its
length (both are in the resized checkpoint's config.yaml); padding then follows from the one rule,
so train at a TP with the same padded row count (tools/resize_embeddings.py lists the steps).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import torch

from vepo_mcore.checkpoint.hf import HFCheckpoint, HFWriter, copy_tokenizer_files, tokenizer_vocab_size
from vepo_mcore.config import JobConfig
from vepo_mcore.languages import default_tokenizer_dir
from vepo_mcore.models.builder import build_model
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.parallel import init_model_parallel
from vepo_mcore.tokenizer.embedding_rows import _backend, new_row_sources, resize_embedding
from vepo_mcore.training.checkpointing import checkpoint_config, save_checkpoint
from vepo_mcore.training.state_dict import load_model_state

# Imported where used: megatron.core (heavy: seconds to import; only the Megatron path loads it, never an HF
# resize or the CLI's checks).

VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")
HF_VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")
HF_CONFIG_FILE = "hf_config.json"
MANIFEST_FILE = "expansion_manifest.json"


@dataclasses.dataclass(frozen=True)
class ResizePlan:
    """What the resize does: base/new real vocab sizes and the new rows' sources."""

    base_vocab: int
    new_vocab: int
    sources: dict[int, list[int]]


def plan_resize(base_tokenizer, expanded_tokenizer, old_vocab: int, where: str) -> ResizePlan:
    """Sources of the new rows; checks that the model's real vocab is the base tokenizer's length.

    old_vocab: the model's real vocab size (model.vocab_size, or the HF tokenizer length);
    `where` names the file it came from for the error message.
    """
    base_tokenizer, expanded_tokenizer = _backend(base_tokenizer), _backend(expanded_tokenizer)  # read once
    base_size = base_tokenizer.get_vocab_size(with_added_tokens=True)
    if old_vocab != base_size:
        raise ValueError(
            f"{where}: the model's vocab size is {old_vocab} but the base tokenizer has {base_size} ids; "
            "pass the tokenizer the model was trained with as the base (--base-tokenizer)"
        )
    sources = new_row_sources(base_tokenizer, expanded_tokenizer)
    return ResizePlan(base_size, base_size + len(sources), sources)


def _copy_expanded_tokenizer(expanded_dir: Path, dst: Path) -> None:
    """Tokenizer files (and the expansion manifest, for provenance) of the expanded directory."""
    if not copy_tokenizer_files(expanded_dir, dst):
        raise FileNotFoundError(f"{expanded_dir} holds no tokenizer files (tokenizer.json expected)")
    if (expanded_dir / MANIFEST_FILE).is_file():
        shutil.copyfile(expanded_dir / MANIFEST_FILE, dst / MANIFEST_FILE)


# ----------------------------------------------------------------------------- Megatron


def _build_config(cfg: JobConfig) -> JobConfig:
    """The config the resize builds with: CPU-safe (local spec, no FP8, no SP/CP), same shapes/dtype."""
    build = copy.deepcopy(cfg)
    build.model.transformer_impl = "local"
    build.model.fp8.format = None
    build.parallel.sequence_parallel = False
    build.parallel.context_parallel_size = 1
    # torch_dist stores global tensors: only TP (the padded row count) shapes the output, not VPP.
    build.parallel.virtual_pipeline_model_parallel_size = None
    return build


def _full_vocab_entry(entry, global_shape, dtype):
    """A ShardedTensor reading the whole vocab tensor (every rank reads all of it)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return ShardedTensor.from_rank_offsets(entry.key, torch.empty(global_shape, dtype=dtype))


def _tp_rows(full: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a vocab-parallel tensor: [padded, h] -> [padded / TP, h] (megatron's order)."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    per = full.shape[0] // tp
    return full[rank * per : (rank + 1) * per].clone()


def resize_megatron_checkpoint(
    load: str | Path,
    save: str | Path,
    expanded_tokenizer: str | Path,
    base_tokenizer: str | Path | None = None,
    overrides: list[str] | None = None,
    seed: int = 1234,
) -> Path:
    """Collective: resize the checkpoint at `load` for `expanded_tokenizer` and save it to `save`.

    Runs in a process group of TP*PP*k ranks at the layout of the checkpoint's config.yaml plus
    `overrides` (dotted, e.g. ["--parallel.tensor_model_parallel_size=2"]); the layout decides the
    padded row count (padded_vocab_size(new_vocab, make_vocab_size_divisible_by, TP)).
    Returns the saved iteration directory.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import load_tensors_metadata

    expanded_dir = Path(expanded_tokenizer).resolve()
    cfg, path = checkpoint_config(load, overrides)
    plan = plan_resize(
        base_tokenizer or default_tokenizer_dir(), expanded_dir, cfg.model.vocab_size, f"{path}/config.yaml"
    )
    new_cfg = copy.deepcopy(cfg)
    new_cfg.model.vocab_size = plan.new_vocab
    new_cfg.tokenizer.path = str(expanded_dir)

    build_cfg = _build_config(new_cfg)
    init_model_parallel(build_cfg.parallel, seed=seed)
    model = build_model(build_cfg)
    tp = build_cfg.parallel.tensor_model_parallel_size
    padded = padded_vocab_size(plan.new_vocab, build_cfg.model.make_vocab_size_divisible_by, tp)

    metadata = load_tensors_metadata(str(path))
    sharded = model.sharded_state_dict()
    vocab_entries = {}
    for name, entry in list(sharded.items()):
        if getattr(entry, "key", None) in VOCAB_KEYS:
            shape = metadata[entry.key].global_shape
            if shape[0] < plan.base_vocab:
                raise ValueError(
                    f"{path}: {entry.key} has {shape[0]} rows, fewer than the vocab {plan.base_vocab}"
                )
            sharded[name] = _full_vocab_entry(entry, shape, entry.data.dtype)
            vocab_entries[name] = entry.key
    state = dist_checkpointing.load({"model": sharded}, str(path), validate_access_integrity=False)["model"]
    for name in vocab_entries:
        state[name] = _tp_rows(resize_embedding(state[name], plan.new_vocab, padded, plan.sources))
    load_model_state(model, state)  # strict, except TE `_extra_state`

    save_dir = Path(save)
    out = save_checkpoint(save_dir, 0, model, None, config=new_cfg, tokenizer_dir=expanded_dir)
    if torch.distributed.get_rank() == 0:
        if (expanded_dir / MANIFEST_FILE).is_file():  # save_checkpoint copied the tokenizer files
            for where in (save_dir, out):
                shutil.copyfile(expanded_dir / MANIFEST_FILE, where / "tokenizer" / MANIFEST_FILE)
        for source in (path / HF_CONFIG_FILE, path.parent / HF_CONFIG_FILE):
            if source.is_file():
                hf_cfg = json.loads(source.read_text())
                hf_cfg["vocab_size"] = padded_vocab_size(
                    plan.new_vocab, cfg.model.make_vocab_size_divisible_by
                )
                (save_dir / HF_CONFIG_FILE).write_text(json.dumps(hf_cfg, indent=2) + "\n")
                break
    torch.distributed.barrier()
    return out


def megatron_worker(rank: int, world_size: int, load, save, tokenizer, base_tokenizer, overrides) -> None:
    """run_processes body of tools/resize_embeddings.py (importable, so spawn can pickle it)."""
    out = resize_megatron_checkpoint(load, save, tokenizer, base_tokenizer, overrides)
    if rank == 0:
        print(f"wrote {out}")


# ----------------------------------------------------------------------------- Hugging Face


def resize_hf_checkpoint(
    hf_in: str | Path,
    hf_out: str | Path,
    expanded_tokenizer: str | Path,
    base_tokenizer: str | Path | None = None,
    divisible_by: int = 128,
    max_shard_bytes: int = 5 << 30,
) -> Path:
    """Resize an HF Qwen2 directory's embeddings for `expanded_tokenizer`, writing `hf_out`.

    The base vocab is the tokenizer.json of `hf_in` when present, else `base_tokenizer` (default
    the shipped Qwen2.5); rows become padded_vocab_size(new_vocab, divisible_by, 1).
    """
    hf_in, hf_out, expanded_dir = Path(hf_in), Path(hf_out), Path(expanded_tokenizer)
    if hf_out.resolve() == hf_in.resolve():
        raise ValueError(f"--hf-out {hf_out} must differ from --hf-in (the source is read while writing)")
    reader = HFCheckpoint(hf_in)
    base = base_tokenizer or default_tokenizer_dir()
    base = _backend(base)
    old_vocab = tokenizer_vocab_size(hf_in) or base.get_vocab_size(with_added_tokens=True)
    plan = plan_resize(base, expanded_dir, old_vocab, f"{hf_in}/tokenizer.json")
    rows = padded_vocab_size(plan.new_vocab, divisible_by, 1)
    if int(reader.config.get("vocab_size", 0)) < plan.base_vocab:
        raise ValueError(
            f"{hf_in}/config.json: vocab_size {reader.config.get('vocab_size')} is below the tokenizer's "
            f"{plan.base_vocab} ids"
        )
    with HFWriter(hf_out, max_shard_bytes) as writer:
        for name in reader.names():
            tensor = reader.get(name)
            if name in HF_VOCAB_TENSORS:
                tensor = resize_embedding(tensor, plan.new_vocab, rows, plan.sources)
            writer.add(name, tensor)
    config = dict(reader.config, vocab_size=rows)
    (hf_out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if (hf_in / "generation_config.json").is_file():
        shutil.copyfile(hf_in / "generation_config.json", hf_out / "generation_config.json")
    _copy_expanded_tokenizer(expanded_dir, hf_out)
    return hf_out
