"""HF Qwen2 <-> megatron.core dist checkpoints (torch_dist), the work behind tools/convert_hf.py.

    hf_to_megatron("Qwen2.5-7B", "ckpt/qwen7b", tp=4, pp=2)   # one process writes every rank's shards
    megatron_to_hf("ckpt/qwen7b", "Qwen2.5-7B-vepo")           # from any TP/PP, one process

A converted checkpoint directory holds:
    config.yaml                         JobConfig (model section from config.json; parallel = TP/PP written)
    hf_config.json                      the source config.json (export restores its fields and row count)
    tokenizer/                          the source tokenizer files
    iter_0000000/                       megatron dist checkpoint of model.sharded_state_dict()
    latest_checkpointed_iteration.txt   "0" (Megatron-LM's pointer to the newest iter_* directory)

torch_dist stores global tensors, so a checkpoint written at one TP/PP loads at any other
(`load_megatron_checkpoint`). Vocab rows: megatron pads the real vocab (the tokenizer's length)
by the one padding rule with zero rows; export writes the source checkpoint's row count (152,064
for Qwen2.5) when known, else the padded size, with every row >= the real vocab zero.
Both directions stream, so memory stays near the largest tensor, not the model
(benchmarks/convert_memory.py): HF -> megatron builds no model and cuts each TP/PP rank's shards
from one HF tensor at a time (stream.py writes them with torch.distributed.checkpoint in
megatron's torch_dist layout); megatron -> HF reads the stored chunks one layer at a time and
HFWriter writes each tensor as it comes.
megatron.core and transformers are imported inside the functions that use them, so the CLI's
checks and errors come before either loads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from vepo_mcore.checkpoint import mapping
from vepo_mcore.checkpoint.hf import (
    HFCheckpoint,
    HFWriter,
    copy_tokenizer_files,
    hf_config_from_model,
    hf_dtype,
    model_config_from_hf,
    read_hf_config,
    tokenizer_vocab_size,
)
from vepo_mcore.checkpoint.stream import (
    Chunk,
    checkpoint_layout,
    hf_chunk_source,
    read_metadata,
    read_regions,
    write_dist_checkpoint,
)
from vepo_mcore.config import JobConfig, ParallelConfig, load_config, save_config, to_dict
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.parallel import destroy, init_distributed
from vepo_mcore.training.state_dict import load_model_state

# Imported where used: megatron.core (heavy: seconds to import; the CLI's checks and errors come first),
# torch.distributed.checkpoint (heavy: seconds on top of torch; only reading a checkpoint's metadata needs
# it).

CONFIG_FILE = "config.yaml"
HF_CONFIG_FILE = "hf_config.json"
TOKENIZER_DIR = "tokenizer"
LATEST_FILE = "latest_checkpointed_iteration.txt"


def iteration_dir(ckpt_dir: str | Path, iteration: int) -> Path:
    return Path(ckpt_dir) / f"iter_{iteration:07d}"


def resolve_checkpoint_dir(ckpt_dir: str | Path) -> Path:
    """The dist-checkpoint directory: `ckpt_dir` itself, or the iter_* its latest pointer names."""
    path = Path(ckpt_dir)
    if (path / "metadata.json").is_file():
        return path
    latest = path / LATEST_FILE
    if latest.is_file():
        text = latest.read_text().strip()
        sub = path / ("release" if text == "release" else f"iter_{int(text):07d}")
        if (sub / "metadata.json").is_file():
            return sub
        raise FileNotFoundError(f"{latest} names {sub.name}, which is not a complete dist checkpoint")
    raise FileNotFoundError(
        f"{path} is not a megatron dist checkpoint (no metadata.json and no {LATEST_FILE})"
    )


def find_config(ckpt_dir: str | Path) -> Path:
    """config.yaml beside the checkpoint (in `ckpt_dir` or its parent when given an iter_* dir)."""
    path = Path(ckpt_dir)
    for candidate in (path / CONFIG_FILE, path.parent / CONFIG_FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no {CONFIG_FILE} in {path} or its parent; it describes the model shape")


# ----------------------------------------------------------------------------- planning


def plan_hf_to_megatron(
    hf_dir: str | Path, tp: int = 1, pp: int = 1, vocab_size: int | None = None
) -> tuple[JobConfig, HFCheckpoint]:
    """Validate an HF checkpoint for conversion at TP/PP and return the JobConfig to build with.

    vocab_size: real ids; default the tokenizer.json's length, else config.json's vocab_size.
    Raises ValueError naming the offending config.json / parallel field.
    """
    reader = HFCheckpoint(hf_dir)
    if vocab_size is None:
        vocab_size = tokenizer_vocab_size(hf_dir)
    has_bias = "model.layers.0.self_attn.q_proj.bias" in reader
    model_cfg = model_config_from_hf(reader.config, vocab_size, add_qkv_bias=has_bias)
    cfg = JobConfig(
        model=model_cfg,
        parallel=ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp),
    )
    dtype = hf_dtype(reader.config)
    # fp16 is widened to fp32 (lossless); megatron params are bf16 or fp32.
    cfg.training.bf16 = dtype == torch.bfloat16
    cfg.parallel.validate(tp * pp)
    model_cfg.validate(tp)
    if model_cfg.num_layers % pp:
        raise ValueError(
            f"config.json: num_hidden_layers ({model_cfg.num_layers}) must be divisible by "
            f"parallel.pipeline_model_parallel_size ({pp})"
        )
    rows = reader.shape("model.embed_tokens.weight")[0] if "model.embed_tokens.weight" in reader else None
    if rows != int(reader.config["vocab_size"]):
        raise ValueError(
            f"{hf_dir}: config.json vocab_size ({reader.config['vocab_size']}) differs from the "
            f"model.embed_tokens.weight rows ({rows})"
        )
    if reader.config.get("tie_word_embeddings") is False and "lm_head.weight" not in reader:
        raise ValueError(f"{hf_dir}: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
    return cfg, reader


def dry_run(hf_dir: str | Path, tp: int = 1, pp: int = 1, vocab_size: int | None = None) -> str:
    """The tensor mapping as text: megatron name [full shape] <- HF names [fusion, TP split]."""
    cfg, reader = plan_hf_to_megatron(hf_dir, tp, pp, vocab_size)

    m = cfg.model
    padded = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    lines = [
        f"# {hf_dir}: {m.num_layers} layers, hidden {m.hidden_size}, heads {m.num_attention_heads}/"
        f"{m.num_query_groups}, real vocab {m.vocab_size}, HF rows {reader.config['vocab_size']}, "
        f"megatron rows {padded} (TP={tp}, PP={pp}), tied={m.tie_word_embeddings}, qkv_bias={m.add_qkv_bias}"
    ]
    for name, hf_names, kind, tp_split in mapping.mapping_table(m):
        shapes = [reader.shape(n) for n in hf_names]
        if kind == "vocab":
            shape = [padded, *shapes[0][1:]]
        else:
            shape = [sum(s[0] for s in shapes), *shapes[0][1:]]
        lines.append(f"{name} {shape} <- {' + '.join(hf_names)}  [{kind}, {tp_split}]")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- model <-> files


def layer_offset(model) -> int:
    """Global index of this pipeline stage's first layer."""
    layers = model.decoder.layers
    return layers[0].layer_number - 1 if len(layers) else 0


def load_hf_into_model(model, reader: HFCheckpoint, cfg: JobConfig) -> None:
    """Copy this rank's TP shard of every parameter from the HF checkpoint (one tensor at a time).

    Vocab tensors are copied in row chunks straight into the parameter, so the largest
    temporary is one layer's tensor, not the embedding.
    """
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    offset = layer_offset(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            global_name = mapping.global_layer_name(name, offset)
            _, rule = mapping.parse_megatron_name(global_name)
            if rule.kind == "vocab":
                _copy_vocab_shard(
                    param, mapping.hf_names_for(global_name, cfg.model)[0], reader, cfg, tp_rank
                )
                continue
            full = mapping.hf_to_megatron_tensor(global_name, reader.get, cfg.model, 0)
            shard = mapping.tp_split(global_name, full, tp_size)[tp_rank]
            if shard.shape != param.shape:
                raise ValueError(
                    f"{global_name}: HF gives shard {tuple(shard.shape)}, model has {tuple(param.shape)}"
                )
            param.copy_(shard)
            del full, shard


def _copy_vocab_shard(
    param, hf_name: str, reader: HFCheckpoint, cfg: JobConfig, tp_rank: int, chunk: int = 8192
):
    """Rows [r * P/TP, (r+1) * P/TP) of the padded vocab: real ids from HF, the rest zero."""
    rows, hidden = param.shape
    hf_rows, hf_hidden = reader.shape(hf_name)
    if hf_hidden != hidden or hf_rows < cfg.model.vocab_size:
        raise ValueError(
            f"{hf_name}: shape {[hf_rows, hf_hidden]} does not hold {cfg.model.vocab_size} rows of width {hidden}"
        )
    start = tp_rank * rows
    stop = min(start + rows, cfg.model.vocab_size)
    param.zero_()
    for a in range(start, stop, chunk):
        b = min(a + chunk, stop)
        param[a - start : b - start].copy_(reader.get_rows(hf_name, a, b))


def _sharded_state_dict(model_chunks) -> dict:
    chunks = model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    if len(chunks) == 1:
        return {"model": chunks[0].sharded_state_dict()}
    return {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}


def save_megatron_checkpoint(model_chunks, ckpt_dir: str | Path, common: dict | None = None) -> None:
    """Collective: every rank of the model's TP/PP layout writes its shards to `ckpt_dir` with
    megatron's own save (the reference the streamed writers are checked against).
    common: plain values saved beside the tensors (common.pt), e.g. the training loop's fields.
    """
    from megatron.core import dist_checkpointing

    path = Path(ckpt_dir)
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    sharded = _sharded_state_dict(model_chunks)
    sharded.update(common or {})
    dist_checkpointing.save(sharded, str(path))


def load_megatron_checkpoint(model_chunks, ckpt_dir: str | Path) -> None:
    """Collective: load a dist checkpoint written at any TP/PP into this rank's model chunk(s).

    `ckpt_dir` is the iter_* directory or its parent with a latest pointer. Vocab tensors of a
    different padded size load their overlapping rows (megatron marks them shape-mismatch tolerant).
    """
    from megatron.core import dist_checkpointing

    path = resolve_checkpoint_dir(ckpt_dir)
    chunks = model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    loaded = dist_checkpointing.load(_sharded_state_dict(chunks), str(path))
    keys = ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]
    for chunk, key in zip(chunks, keys):
        load_model_state(chunk, loaded[key])  # strict, except TE `_extra_state`


@contextlib.contextmanager
def local_process_group():
    """A 1-process gloo group for in-process conversion (reuses an existing group of size 1)."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError("single-process conversion called inside a multi-process group")
        yield
        return
    init_distributed("gloo", rank=0, world_size=1, in_memory=True)
    try:
        yield
    finally:
        destroy()


def weights_only_common(cfg: JobConfig) -> dict:
    """common.pt of a weights-only checkpoint, as vepo_mcore.training.checkpointing writes and reads it."""
    p = cfg.parallel
    return {
        "format_version": 1,
        "iteration": 0,
        "consumed_samples": 0,
        "has_optimizer": False,
        "parallel": {"tp": p.tensor_model_parallel_size, "pp": p.pipeline_model_parallel_size, "dp": 1},
        "config": to_dict(cfg),
    }


def write_streamed(
    out: Path,
    cfg: JobConfig,
    source: Callable[[Chunk], torch.Tensor],
    prepare: Callable[[], None],
    caller: str,
) -> Path:
    """Write a weights-only checkpoint of cfg's model at cfg.parallel's TP/PP to `out`, shard by
    shard from source(chunk) (stream.py), without building the model; returns out.

    Called outside a process group this process writes every rank's shards; called by every rank
    of an existing group of exactly TP*PP processes each rank writes its own. `prepare()` runs
    first, on rank 0 only (side files such as the tokenizer); `caller` names the public function
    in the group-size error.
    """
    world = cfg.parallel.tensor_model_parallel_size * cfg.parallel.pipeline_model_parallel_size
    in_group = dist.is_initialized() and dist.get_world_size() > 1
    if in_group and dist.get_world_size() != world:
        raise ValueError(f"{caller} at TP*PP={world} called in a group of {dist.get_world_size()} processes")
    main = not in_group or dist.get_rank() == 0
    if main:
        out.mkdir(parents=True, exist_ok=True)
        prepare()
    chunks, objects = checkpoint_layout(cfg)  # write_dist_checkpoint waits for rank 0's directory
    write_dist_checkpoint(
        iteration_dir(out, 0),
        chunks,
        objects,
        source,
        weights_only_common(cfg),
        ranks=[dist.get_rank()] if in_group else None,
    )
    # The pointer and config are written last: a directory with them is a complete checkpoint.
    if main:
        # Inside the iteration too, like the training loop's checkpoints (self-contained).
        save_config(cfg, iteration_dir(out, 0) / CONFIG_FILE)
        save_config(cfg, out / CONFIG_FILE)
        (out / LATEST_FILE).write_text("0\n")
    if in_group:
        dist.barrier()
    return out


def hf_to_megatron(
    hf_dir: str | Path, out_dir: str | Path, tp: int = 1, pp: int = 1, vocab_size: int | None = None
) -> Path:
    """Convert an HF Qwen2 directory to a megatron dist checkpoint written at TP/PP; returns out_dir.

    Streams: no model is built; every TP/PP rank's shards are cut from the HF tensors one
    tensor at a time and written as they are cut (stream.py), so memory stays near the largest
    tensor whatever TP/PP. Called outside a process group this process writes every rank's
    shards; called by every rank of an existing group of exactly TP*PP processes each rank
    writes its own.
    """
    cfg, reader = plan_hf_to_megatron(hf_dir, tp, pp, vocab_size)
    out = Path(out_dir)
    if (out / TOKENIZER_DIR / "tokenizer.json").is_file() or (Path(hf_dir) / "tokenizer.json").is_file():
        cfg.tokenizer.path = str((out / TOKENIZER_DIR).resolve())

    def prepare() -> None:
        copy_tokenizer_files(hf_dir, out / TOKENIZER_DIR)
        (out / HF_CONFIG_FILE).write_text(json.dumps(read_hf_config(hf_dir), indent=2) + "\n")

    try:
        return write_streamed(out, cfg, hf_chunk_source(reader, cfg), prepare, "hf_to_megatron")
    finally:
        reader.close()


def checkpoint_tensors(ckpt_dir: str | Path, num_layers: int):
    """(megatron name, full tensor) of the model weights in a dist checkpoint, one layer at a time.

    Reads only the stored chunks it needs (stream.read_regions; no process group). Independent
    of the TP/PP the checkpoint was written at: torch_dist stores global tensors, layers stacked
    on a leading axis, fc1 as [gate; up], norms under the Transformer Engine names (megatron maps
    the local spec's keys to those). Optimizer and RNG entries of training checkpoints are skipped.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = resolve_checkpoint_dir(ckpt_dir)
    metadata = read_metadata(path)
    stored = {k: v for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    layer_prefix = "decoder.layers."
    layer_keys = [k for k in stored if k.startswith(layer_prefix)]
    for key in layer_keys:
        if stored[key].size[0] != num_layers:
            raise ValueError(f"{path}: {key} stacks {stored[key].size[0]} layers, config says {num_layers}")

    def whole(key: str) -> torch.Tensor:
        size = tuple(stored[key].size)
        return read_regions(path, {key: ((0,) * len(size), size)}, metadata)[key]

    if "embedding.word_embeddings.weight" in stored:
        yield "embedding.word_embeddings.weight", whole("embedding.word_embeddings.weight")
    for layer in range(num_layers):
        regions = {}
        for key in layer_keys:
            size = tuple(stored[key].size)
            regions[key] = ((layer,) + (0,) * (len(size) - 1), (1, *size[1:]))
        tensors = read_regions(path, regions, metadata)
        for key in layer_keys:
            yield f"{layer_prefix}{layer}.{key[len(layer_prefix) :]}", tensors.pop(key)[0]
    for key in ("decoder.final_layernorm.weight", "output_layer.weight"):
        if key in stored:
            yield key, whole(key)


def megatron_to_hf(
    ckpt_dir: str | Path,
    out_dir: str | Path,
    max_shard_bytes: int = 5 << 30,
    dtype: torch.dtype | None = None,
    vocab_rows: int | None = None,
) -> Path:
    """Export a megatron dist checkpoint (any TP/PP) to an HF directory transformers loads.

    Streams: tensors are read one layer at a time and written shard by shard, so memory stays
    near one shard (max_shard_bytes), not the model. dtype: default the source config.json's,
    else the checkpoint's params dtype. vocab_rows: default the source config.json's vocab_size,
    else the padded size at TP=1.
    """
    cfg = load_config(JobConfig, find_config(ckpt_dir))
    root = find_config(ckpt_dir).parent
    template = json.loads((root / HF_CONFIG_FILE).read_text()) if (root / HF_CONFIG_FILE).is_file() else None
    m = cfg.model
    if dtype is None:
        dtype = hf_dtype(template) if template else (torch.bfloat16 if cfg.training.bf16 else torch.float32)
    if vocab_rows is None:
        known = int(template["vocab_size"]) if template else 0
        vocab_rows = (
            known
            if known >= m.vocab_size
            else padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by)
        )
    if vocab_rows < m.vocab_size:
        raise ValueError(f"cannot write {vocab_rows} vocab rows: the real vocab size is {m.vocab_size}")
    out = Path(out_dir)
    with HFWriter(out, max_shard_bytes) as writer:
        for name, tensor in checkpoint_tensors(ckpt_dir, m.num_layers):
            _, rule = mapping.parse_megatron_name(name)
            if rule.kind != "vocab":
                for hf_name, hf_tensor in mapping.megatron_to_hf_tensors([(name, tensor)], m, vocab_rows):
                    writer.add(hf_name, hf_tensor.to(dtype))
            elif not (name == "output_layer.weight" and m.tie_word_embeddings):
                # What mapping.pad_vocab_rows does, in place: this tensor is ours, and a padded
                # copy of the largest tensor would cost its size again.
                if tensor.shape[0] < m.vocab_size:
                    raise ValueError(
                        f"{name} has {tensor.shape[0]} rows, fewer than the real vocab size {m.vocab_size}"
                    )
                tensor[m.vocab_size :] = 0
                writer.add(mapping.hf_names_for(name, m)[0], tensor.to(dtype), rows=vocab_rows)
    hf_cfg = hf_config_from_model(m, template, vocab_rows, dtype)
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    tokenizer_src = Path(cfg.tokenizer.path) if cfg.tokenizer.path else root / TOKENIZER_DIR
    copy_tokenizer_files(tokenizer_src, out)
    return out
