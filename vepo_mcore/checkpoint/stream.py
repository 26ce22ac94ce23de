"""Write a megatron dist checkpoint (torch_dist) chunk by chunk, without building the model.

    chunks, objects = checkpoint_layout(cfg)                      # every TP/PP rank's shards
    write_dist_checkpoint(iter_dir, chunks, objects, source, common)  # source(chunk) -> its tensor

megatron's own save (`dist_checkpointing.save`) needs the model built and stages every tensor
of a rank before writing, so a conversion held the whole model (plus copies). Here the write
items are planned from the config alone, and torch.distributed.checkpoint's file writer asks
the planner for each tensor just before writing it: one source tensor is alive at a time.

The layout is megatron's for QwenGPTModel with the local layer spec (what `build_model` builds
on CPU): one ShardedTensor key per weight with the layers stacked on a leading axis, norms under
the Transformer Engine names and in fp32 (torch's RMSNorm ignores params_dtype), fc1 as
[gate; up] with each TP rank's gate and up rows as two chunks, vocab rows split over TP ranks,
replicated tensors written once, and an empty `_extra_state` object per linear layer.
tests/unit/test_convert_stream.py and tests/dist/test_convert_parity.py check it against
megatron's own save at TP=1, TP=2 and PP=2.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from vepo_mcore.checkpoint import mapping
from vepo_mcore.config import JobConfig
from vepo_mcore.models.vocab import padded_vocab_size

# Imported where used: torch.distributed.checkpoint (heavy: seconds on top of torch; conversion's CLI checks
# and --dry-run come first).

# The local spec's norm names -> the keys megatron stores them under (Transformer Engine's).
NORM_KEYS = {v: k for k, v in mapping.TE_ALIASES.items()}
EXTRA_STATE_MODULES = (
    "self_attention.linear_proj",
    "self_attention.linear_qkv",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)
LAYER_KEY = "decoder.layers."
# metadata.json, as megatron's save writes it (CheckpointingConfig of the torch_dist backend).
MEGATRON_FORMAT = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}


@dataclass(frozen=True)
class Chunk:
    """One stored shard: rows/columns `offsets`..`offsets + sizes` of checkpoint tensor `key`.

    name: the global megatron tensor name the shard is cut from (mapping's names);
    shapes include the stacked layer axis for layer tensors; rank: the TP*PP rank that owns it
    (megatron's order, TP fastest).
    """

    key: str
    name: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: torch.dtype
    rank: int

    @property
    def stacked(self) -> bool:
        return self.key.startswith(LAYER_KEY)

    def region(self) -> tuple[slice, ...]:
        """The shard's slices in the full (one-layer) megatron tensor `name`."""
        skip = 1 if self.stacked else 0
        return tuple(slice(o, o + s) for o, s in zip(self.offsets[skip:], self.sizes[skip:]))


def full_shape(name: str, cfg: JobConfig, padded_vocab: int) -> tuple[int, ...]:
    """Shape of the full (TP-gathered, one-layer) megatron tensor `name`."""
    m = cfg.model
    h, d, f = m.hidden_size, m.head_dim, m.ffn_hidden_size
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * d
    _, rule = mapping.parse_megatron_name(name)
    shapes = {
        "input_layernorm.weight": (h,),
        "self_attention.linear_qkv.weight": (qkv, h),
        "self_attention.linear_qkv.bias": (qkv,),
        "self_attention.linear_proj.weight": (h, m.num_attention_heads * d),
        "pre_mlp_layernorm.weight": (h,),
        "mlp.linear_fc1.weight": (2 * f, h),
        "mlp.linear_fc2.weight": (h, f),
        "embedding.word_embeddings.weight": (padded_vocab, h),
        "decoder.final_layernorm.weight": (h,),
        "output_layer.weight": (padded_vocab, h),
    }
    return shapes[rule.megatron]


def _tp_regions(rule: mapping.Rule, shape: tuple[int, ...], tp: int, tp_rank: int):
    """(offsets, sizes) of TP rank `tp_rank`'s chunks of a full tensor, as megatron shards it."""
    if rule.tp is None:
        return [((0,) * len(shape), shape)] if tp_rank == 0 else []  # replicas: rank 0 writes
    if rule.tp == "gate_up":
        part = shape[0] // 2 // tp
        return [((half * shape[0] // 2 + tp_rank * part, 0), (part, shape[1])) for half in (0, 1)]
    axis = 0 if rule.tp == "column" else 1
    part = shape[axis] // tp
    offsets = tuple(tp_rank * part if i == axis else 0 for i in range(len(shape)))
    sizes = tuple(part if i == axis else s for i, s in enumerate(shape))
    return [(offsets, sizes)]


def checkpoint_layout(cfg: JobConfig) -> tuple[list[Chunk], list[tuple[str, int]]]:
    """Every shard megatron's save writes for cfg's model at cfg.parallel's TP/PP.

    Returns (tensor chunks, (object key, rank) of the `_extra_state` objects), tensor by tensor
    in forward order with each tensor's chunks in rank order.
    """
    m, p = cfg.model, cfg.parallel
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    padded = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    params_dtype = torch.bfloat16 if cfg.training.bf16 else torch.float32
    per_stage = m.num_layers // pp
    chunks: list[Chunk] = []
    objects: list[tuple[str, int]] = []
    for name in mapping.megatron_names(m):
        layer, rule = mapping.parse_megatron_name(name)
        shape = full_shape(name, cfg, padded)
        dtype = torch.float32 if rule.megatron.endswith("layernorm.weight") else params_dtype
        if layer is None:
            stage = 0 if rule.megatron.startswith("embedding") else pp - 1
            key, stack = name, ()
        else:
            stage = layer // per_stage
            key = LAYER_KEY + NORM_KEYS.get(rule.megatron, rule.megatron)
            stack = (layer,)
        global_shape = (m.num_layers, *shape) if stack else shape
        for tp_rank in range(tp):
            for offsets, sizes in _tp_regions(rule, shape, tp, tp_rank):
                chunks.append(
                    Chunk(
                        key,
                        name,
                        global_shape,
                        (*stack, *offsets),
                        (1, *sizes) if stack else sizes,
                        dtype,
                        stage * tp + tp_rank,
                    )
                )
        if layer is not None and rule.megatron == mapping.LAYER_RULES[-1].megatron:
            for module in EXTRA_STATE_MODULES:
                key = f"{LAYER_KEY}{module}._extra_state/shard_{layer}_{m.num_layers}"
                objects.append((key, stage * tp))
    return chunks, objects


def hf_chunk_source(reader, cfg: JobConfig) -> Callable[[Chunk], torch.Tensor]:
    """source(chunk) reading an HF checkpoint: only the vocab rows a chunk holds, else one full
    megatron tensor (the last one is kept for the chunks that follow it, e.g. fc1's halves)."""
    m = cfg.model
    last: dict[str, torch.Tensor] = {}

    def source(chunk: Chunk) -> torch.Tensor:
        layer, rule = mapping.parse_megatron_name(chunk.name)
        if rule.kind == "vocab":
            hf_name = mapping.hf_names_for(chunk.name, m)[0]
            rows, hidden = reader.shape(hf_name)
            if hidden != chunk.sizes[1] or rows < m.vocab_size:
                raise ValueError(
                    f"{hf_name}: shape {[rows, hidden]} does not hold {m.vocab_size} rows of width {chunk.sizes[1]}"
                )
            start, stop = chunk.offsets[0], min(chunk.offsets[0] + chunk.sizes[0], m.vocab_size)
            out = torch.zeros(chunk.sizes, dtype=chunk.dtype)
            # In blocks of ~64 MiB: a block is read through a memory map and copied, so reading
            # the rows at once would hold them twice more.
            block = max(1, (64 << 20) // (hidden * out.element_size()))
            for a in range(start, stop, block):
                b = min(a + block, stop)
                out[a - start : b - start] = reader.get_rows(hf_name, a, b)
            return out
        if chunk.name not in last:
            last.clear()
            last[chunk.name] = mapping.hf_to_megatron_tensor(chunk.name, reader.get, m, 0)
        full = last[chunk.name]
        if tuple(full.shape) != chunk.global_shape[1 if chunk.stacked else 0 :]:
            raise ValueError(
                f"{chunk.name}: HF tensors give shape {tuple(full.shape)}, the config expects "
                f"{chunk.global_shape[1 if chunk.stacked else 0 :]}"
            )
        return full[chunk.region()].to(chunk.dtype).reshape(chunk.sizes)

    return source


def dist_chunk_source(path: str | Path, cfg: JobConfig) -> Callable[[Chunk], torch.Tensor]:
    """source(chunk) reading a dist checkpoint of the same model at any TP/PP (iteration directory
    `path`): each chunk is read as the region it covers of the stored global tensor; vocab rows past
    the real vocabulary are zero (the new layout's padding), whatever padding the source had."""
    metadata = read_metadata(path)
    stored = metadata.state_dict_metadata
    vocab = cfg.model.vocab_size

    def source(chunk: Chunk) -> torch.Tensor:
        if chunk.key not in stored:
            raise KeyError(f"{path}: no tensor {chunk.key!r} for {chunk.name} (another model's checkpoint?)")
        stored_shape = tuple(stored[chunk.key].size)
        _, rule = mapping.parse_megatron_name(chunk.name)
        if rule.kind != "vocab":
            if stored_shape != chunk.global_shape:
                raise ValueError(
                    f"{path}: {chunk.key} is {list(stored_shape)}, the config expects {list(chunk.global_shape)}"
                )
            region = read_regions(path, {chunk.key: (chunk.offsets, chunk.sizes)}, metadata)[chunk.key]
            return region.to(chunk.dtype)
        if stored_shape[1:] != chunk.global_shape[1:] or stored_shape[0] < vocab:
            raise ValueError(
                f"{path}: {chunk.key} is {list(stored_shape)}, expected >= {vocab} rows of width {chunk.sizes[1]}"
            )
        out = torch.zeros(chunk.sizes, dtype=chunk.dtype)
        start, stop = chunk.offsets[0], min(chunk.offsets[0] + chunk.sizes[0], vocab)
        if stop > start:
            rows = read_regions(path, {chunk.key: ((start, 0), (stop - start, chunk.sizes[1]))}, metadata)
            out[: stop - start] = rows[chunk.key]
        return out

    return source


@contextlib.contextmanager
def _single_process_is_intended():
    """Silence DCP's warning that it runs without a process group: that is the point here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _empty_extra_state() -> io.BytesIO:
    # What megatron stores for a local-spec linear layer's extra state (its get_extra_state is None).
    buffer = io.BytesIO()
    torch.save([None], buffer)
    return buffer


def _planner(chunks: list[Chunk], objects: list[str], source: Callable[[Chunk], torch.Tensor]):
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    class ChunkPlanner(DefaultSavePlanner):
        """Plans the chunks' write items up front; resolves each tensor when the writer asks."""

        def create_local_plan(self) -> SavePlan:
            items = [
                WriteItem(
                    index=MetadataIndex(c.key, torch.Size(c.offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)),
                        properties=TensorProperties(dtype=c.dtype),
                        size=torch.Size(c.global_shape),
                    ),
                )
                for c in chunks
            ]
            items += [WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO) for key in objects]
            self.plan = SavePlan(items)
            return self.plan

        def resolve_data(self, write_item):
            if write_item.type == WriteItemType.BYTE_IO:
                return _empty_extra_state()
            chunk = by_index[(write_item.index.fqn, tuple(write_item.index.offset))]
            tensor = source(chunk)
            if tuple(tensor.shape) != chunk.sizes or tensor.dtype != chunk.dtype:
                raise ValueError(
                    f"{chunk.name}: source gave {tuple(tensor.shape)} {tensor.dtype} for a "
                    f"{chunk.sizes} {chunk.dtype} chunk of {chunk.key}"
                )
            tensor = tensor.contiguous()
            return tensor if tensor.untyped_storage().nbytes() == tensor.nbytes else tensor.clone()

    by_index = {(c.key, c.offsets): c for c in chunks}
    return ChunkPlanner(flatten_state_dict=False, flatten_sharded_tensors=False)


def write_dist_checkpoint(
    path: str | Path,
    chunks: list[Chunk],
    objects: list[tuple[str, int]],
    source: Callable[[Chunk], torch.Tensor],
    common: dict,
    ranks: list[int] | None = None,
) -> None:
    """Write a torch_dist checkpoint megatron's `dist_checkpointing.load` reads, chunk by chunk.

    ranks: whose chunks this process writes. None: all of them, in this process alone (no
    process group needed). Inside a process group every rank calls it with its own ranks and
    rank 0 writes the global metadata. Each chunk goes to its own file: torch's file writer
    keeps every tensor of a file referenced until that file is closed.
    """
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    in_group = ranks is not None and dist.is_initialized()
    main = not in_group or dist.get_rank() == 0
    path = Path(path)
    if main:
        path.mkdir(parents=True, exist_ok=True)
        torch.save(common, path / "common.pt")
    if in_group:
        dist.barrier()
    mine = set(ranks) if ranks is not None else None
    chunks = [c for c in chunks if mine is None or c.rank in mine]
    object_keys = [key for key, rank in objects if mine is None or rank in mine]
    writer = FileSystemWriter(path, single_file_per_rank=False, thread_count=1, per_thread_copy_ahead=0)
    with _single_process_is_intended():
        dcp_save(
            {}, storage_writer=writer, planner=_planner(chunks, object_keys, source), no_dist=not in_group
        )
    # metadata.json last: megatron treats a directory with it as a complete checkpoint.
    if main:
        (path / "metadata.json").write_text(json.dumps(MEGATRON_FORMAT))
    if in_group:
        dist.barrier()


def read_metadata(path: str | Path):
    """The torch.distributed.checkpoint Metadata of a dist checkpoint directory."""
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(path)).read_metadata()


def read_regions(
    path: str | Path, regions: dict[str, tuple[tuple[int, ...], tuple[int, ...]]], metadata=None
) -> dict[str, torch.Tensor]:
    """{key: (offsets, sizes)} -> {key: that region of the stored global tensor}.

    Reads only the stored chunks that overlap a region, whatever TP/PP wrote them, with no
    process group and no megatron import. A chunk's bytes are read straight into the result
    (torch.distributed.checkpoint's own reader would hold each chunk three times: the file
    bytes, the loaded tensor and the copy); chunks stored in another way go through it.
    """
    path = Path(path)
    metadata = metadata or read_metadata(path)
    stored = metadata.state_dict_metadata
    missing = [key for key in regions if key not in stored]
    if missing:
        raise KeyError(f"{path}: the checkpoint has no tensors {missing}")
    out, fallback = {}, {}
    for key, (offsets, sizes) in regions.items():
        out[key] = torch.empty(sizes, dtype=stored[key].properties.dtype)
        for chunk in stored[key].chunks:
            lo = [max(o, c) for o, c in zip(offsets, chunk.offsets)]
            hi = [min(o + s, c + n) for o, s, c, n in zip(offsets, sizes, chunk.offsets, chunk.sizes)]
            if any(h <= low for low, h in zip(lo, hi)):
                continue
            dest = out[key]
            for dim, (low, h, o) in enumerate(zip(lo, hi, offsets)):
                dest = dest.narrow(dim, low - o, h - low)
            whole = list(lo) == list(chunk.offsets) and [h - low for low, h in zip(lo, hi)] == list(
                chunk.sizes
            )
            info = metadata.storage_data.get(_metadata_index(key, chunk.offsets))
            if not (whole and info is not None and _read_stored_tensor(path, info, dest)):
                fallback.setdefault(key, (offsets, sizes))
    if fallback:
        out.update(_read_regions_dcp(path, fallback))
    return out


def _metadata_index(key: str, offsets):
    from torch.distributed.checkpoint.metadata import MetadataIndex

    return MetadataIndex(key, torch.Size(offsets))


class _TensorPickle(pickle.Unpickler):
    """Reads what torch.save pickles for one dense tensor, without building it:
    (storage record name, storage offset, size, stride)."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: (storage, offset, tuple(size), tuple(stride))
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and name.endswith("Storage"):
            return name
        raise pickle.UnpicklingError(f"not a plain tensor: {module}.{name}")

    def persistent_load(self, pid):
        return pid[2]  # ('storage', storage type, record key, location, numel)


def _read_stored_tensor(path: Path, info, dest: torch.Tensor) -> bool:
    """Fill `dest` with one stored chunk (a torch.save zip inside a .distcp file); False when the
    chunk is stored in a way this reader does not handle (then nothing was read)."""
    if getattr(info, "transform_descriptors", None):
        return False
    with open(path / info.relative_path, "rb", buffering=0) as raw:
        window = _Window(raw, info.offset, info.length)
        try:
            with zipfile.ZipFile(window) as archive:
                pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
                storage, offset, size, stride = _TensorPickle(io.BytesIO(archive.read(pkl))).load()
                record = archive.getinfo(f"{pkl[: -len('data.pkl')]}data/{storage}")
        except (zipfile.BadZipFile, pickle.UnpicklingError, StopIteration, KeyError, ValueError, TypeError):
            return False
        if size != tuple(dest.shape) or not torch.empty_strided(size, stride, device="meta").is_contiguous():
            return False
        if record.compress_type != zipfile.ZIP_STORED:
            return False
        window.seek(record.header_offset)
        header = window.read(30)
        start = record.header_offset + 30 + int.from_bytes(header[26:28], "little")
        start += int.from_bytes(header[28:30], "little") + offset * dest.element_size()
        target = dest if dest.is_contiguous() else torch.empty(size, dtype=dest.dtype)
        view = memoryview(target.reshape(-1).view(torch.uint8).numpy())
        window.seek(start)
        done = 0
        while done < len(view):
            n = window.readinto(view[done:])
            if not n:
                raise OSError(f"{path / info.relative_path}: truncated chunk")
            done += n
        if target is not dest:
            dest.copy_(target)
    return True


class _Window(io.RawIOBase):
    """Bytes [start, start + length) of an open file, as a seekable file of their own."""

    def __init__(self, raw, start: int, length: int):
        self.raw, self.start, self.length, self.pos = raw, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = {0: pos, 1: self.pos + pos, 2: self.length + pos}[whence]
        return self.pos

    def readinto(self, buffer) -> int:
        buffer = memoryview(buffer).cast("B")[: max(0, self.length - self.pos)]
        if not len(buffer):
            return 0
        self.raw.seek(self.start + self.pos)
        n = self.raw.readinto(buffer)
        self.pos += n
        return n


def _read_regions_dcp(path: Path, regions: dict) -> dict[str, torch.Tensor]:
    """read_regions through torch.distributed.checkpoint's reader (any storage layout)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    reader = FileSystemReader(str(path))
    stored = reader.read_metadata().state_dict_metadata
    out = {key: torch.empty(sizes, dtype=stored[key].properties.dtype) for key, (_, sizes) in regions.items()}

    class RegionPlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> LoadPlan:
            items = []
            for key, (offsets, sizes) in regions.items():
                wanted = [ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))]
                items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], wanted)
            return LoadPlan(items)

        def resolve_tensor(self, read_item):
            target = out[read_item.dest_index.fqn]
            for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
                target = target.narrow(dim, start, length)
            return target

    with _single_process_is_intended():
        dcp_load({}, storage_reader=reader, planner=RegionPlanner(), no_dist=True)
    return out
