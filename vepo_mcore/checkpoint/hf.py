"""Reading and writing Hugging Face Qwen2 directories: config.json, safetensors, tokenizer files.

reader = HFCheckpoint(hf_dir)          # single file or sharded with model.safetensors.index.json
w = reader.get("model.norm.weight")     # lazy: only this tensor is read (safe_open)
model_cfg = model_config_from_hf(reader.config, vocab_size=tokenizer_vocab_size(hf_dir))

with HFWriter(out_dir, max_shard_bytes=5 << 30) as writer:
    writer.add(name, tensor)            # shards are flushed as they fill up
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save
from tokenizers import Tokenizer

from vepo_mcore.config.model import ModelConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM",)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def read_hf_config(hf_dir: str | Path) -> dict:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{hf_dir} is not a Hugging Face model directory: {path} does not exist")
    return json.loads(path.read_text())


def hf_dtype(hf_config: dict) -> torch.dtype:
    """The checkpoint's dtype from config.json ('dtype' in transformers 5, 'torch_dtype' before)."""
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    if name not in _DTYPES:
        raise ValueError(f"config.json: dtype {name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def rope_theta(hf_config: dict) -> float:
    """RoPE theta; only plain RoPE is supported (no YaRN / dynamic scaling)."""
    params = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling") or {}
    for field, section in (("rope_parameters", params), ("rope_scaling", scaling)):
        rope_type = section.get("rope_type") or section.get("type") or "default"
        if rope_type != "default":
            raise ValueError(
                f"config.json: {field} type {rope_type!r} is not supported; only plain RoPE ('default')"
            )
    theta = params.get("rope_theta", hf_config.get("rope_theta"))
    if theta is None:
        raise ValueError("config.json: rope_theta (or rope_parameters.rope_theta) is missing")
    return float(theta)


def model_config_from_hf(
    hf_config: dict, vocab_size: int | None = None, add_qkv_bias: bool = True
) -> ModelConfig:
    """Our ModelConfig for an HF Qwen2 config.json, refusing what the converter cannot represent.

    vocab_size: real token ids (the tokenizer's length); defaults to config.vocab_size. It may be
    smaller than the checkpoint's row count (Qwen2.5: 151,665 ids, 152,064 rows), never larger.
    """
    archs = hf_config.get("architectures") or []
    if list(archs) != ["Qwen2ForCausalLM"]:
        raise ValueError(
            f"config.json: architectures {archs} not supported; expected {list(SUPPORTED_ARCHITECTURES)}"
        )
    if hf_config.get("use_sliding_window"):
        raise ValueError(
            "config.json: use_sliding_window is true; megatron's Qwen2.5 model has full attention only"
        )
    layer_types = set(hf_config.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(
            f"config.json: layer_types {sorted(layer_types)} not supported; expected full_attention"
        )
    act = hf_config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json: hidden_act {act!r} not supported; expected 'silu' (SwiGLU)")
    rows = int(hf_config["vocab_size"])
    vocab = rows if vocab_size is None else int(vocab_size)
    if vocab > rows:
        raise ValueError(
            f"config.json: vocab_size ({rows}) is smaller than the tokenizer's {vocab} ids; "
            "resize the embeddings first (the tokenizer expansion tool does)"
        )
    heads = int(hf_config["num_attention_heads"])
    hidden = int(hf_config["hidden_size"])
    head_dim = hf_config.get("head_dim")
    return ModelConfig(
        num_layers=int(hf_config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(hf_config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(hf_config.get("num_key_value_heads") or heads),
        kv_channels=int(head_dim) if head_dim and int(head_dim) != hidden // heads else None,
        vocab_size=vocab,
        max_position_embeddings=int(hf_config.get("max_position_embeddings", 32768)),
        rotary_base=rope_theta(hf_config),
        norm_epsilon=float(hf_config.get("rms_norm_eps", 1e-6)),
        add_qkv_bias=add_qkv_bias,
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        attention_dropout=float(hf_config.get("attention_dropout", 0.0)),
    )


def hf_config_from_model(
    cfg: ModelConfig, template: dict | None, vocab_rows: int, dtype: torch.dtype
) -> dict:
    """config.json for an export: the original HF config when known, with the shape fields set from cfg."""
    out = dict(template or {})
    dtype_name = next(k for k, v in _DTYPES.items() if v == dtype)
    out.update(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.ffn_hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_query_groups,
        head_dim=cfg.head_dim,
        vocab_size=vocab_rows,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.norm_epsilon,
        tie_word_embeddings=cfg.tie_word_embeddings,
        hidden_act="silu",
        use_sliding_window=False,
        dtype=dtype_name,
    )
    out.pop("torch_dtype", None)
    out.pop("rope_scaling", None)
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rotary_base}
    out.pop("rope_theta", None)
    return out


def tokenizer_vocab_size(hf_dir: str | Path) -> int | None:
    """Ids of the tokenizer.json in `hf_dir` (added tokens included), or None when there is none."""
    path = Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        return None

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer (and generation config) files present in `src`; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            Path(dst).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied


class HFCheckpoint:
    """Lazy access to the tensors of an HF safetensors checkpoint (single file or sharded)."""

    def __init__(self, hf_dir: str | Path):
        self.dir = Path(hf_dir)
        self.config = read_hf_config(self.dir)
        index = self.dir / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: expected a 'weight_map' mapping of tensor name -> file")
            self.files = dict(weight_map)
        elif (self.dir / SINGLE_FILE).is_file():
            with safe_open(self.dir / SINGLE_FILE, framework="pt") as f:
                self.files = dict.fromkeys(f.keys(), SINGLE_FILE)
        else:
            raise FileNotFoundError(f"{self.dir} has neither {SINGLE_FILE} nor {INDEX_FILE}")

    def names(self) -> list[str]:
        return list(self.files)

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def _path(self, name: str) -> Path:
        if name not in self.files:
            raise KeyError(f"{self.dir}: the checkpoint has no tensor {name!r}")
        path = self.dir / self.files[name]
        if not path.is_file():
            raise FileNotFoundError(f"{self.dir / INDEX_FILE} points {name!r} to missing file {path}")
        return path

    def get(self, name: str) -> torch.Tensor:
        """Read one tensor (a fresh CPU tensor; nothing else of the file is loaded).

        The file is opened per call: safe_open memory-maps it, and a mapping kept open would
        keep every page read so far resident in this process (peak memory ~2x the model).
        """
        with safe_open(self._path(name), framework="pt") as f:
            return f.get_tensor(name)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a tensor, reading only those bytes (vocab shards, chunked copies)."""
        with safe_open(self._path(name), framework="pt") as f:
            return f.get_slice(name)[start:stop]

    def shape(self, name: str) -> list[int]:
        with safe_open(self._path(name), framework="pt") as f:
            return list(f.get_slice(name).get_shape())

    def close(self) -> None:
        """Nothing is held open between reads; kept so callers can release a reader explicitly."""


class HFWriter:
    """Write (name, tensor) pairs as safetensors shards + index, the way save_pretrained lays them out.

    One shard is written as model.safetensors (no index); more as model-0000i-of-0000n.safetensors
    with model.safetensors.index.json. Streams: each tensor's bytes go to a scratch file as they
    come and nothing is kept, so memory stays near one tensor. A full shard is then written as
    safetensors' own `save_file` would write those tensors (the same bytes: header, then the data
    in safetensors' order) by copying from the scratch file inside the kernel.
    """

    def __init__(self, out_dir: str | Path, max_shard_bytes: int = 5 << 30):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self._scratch = None
        self._pending: dict[
            str, tuple[torch.dtype, list[int], int, int]
        ] = {}  # name -> dtype, shape, offset, bytes
        self._pending_bytes = 0
        self._shards: list[tuple[str, list[str]]] = []
        self._written: set[str] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor, rows: int | None = None) -> None:
        """Write `tensor` as `name`; rows: write it with that many rows, cut or zero-padded at the
        end (a vocab matrix exported at another row count, without a padded copy in memory)."""
        if name in self._written:
            raise ValueError(f"tensor {name!r} written twice")
        shape = list(tensor.shape)
        if rows is not None:
            tensor, shape = tensor[:rows], [rows, *shape[1:]]
        size = tensor.element_size() * math.prod(shape)
        if self._pending and self._pending_bytes + size > self.max_shard_bytes:
            self._flush()
        if self._scratch is None:
            self._scratch = open(self.dir / f"shard-{len(self._shards):05d}.tmp.data", "w+b")  # noqa: SIM115
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        self._pending[name] = (tensor.dtype, shape, self._pending_bytes, size)
        self._scratch.write(memoryview(data.numpy()))
        self._scratch.write(bytes(size - data.numel()))  # the zero rows past the tensor's own
        self._written.add(name)
        self._pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        tmp = f"shard-{len(self._shards):05d}.tmp.safetensors"
        header, order = _safetensors_header(self._pending, {"format": "pt"})
        with open(self.dir / tmp, "wb", buffering=0) as out:
            out.write(len(header).to_bytes(8, "little") + header)
            if self._scratch is not None:
                self._scratch.flush()
                for name in order:
                    _, _, offset, size = self._pending[name]
                    _copy_range(self._scratch, out, offset, size)
        if self._scratch is not None:
            self._scratch.close()
            Path(self._scratch.name).unlink()
            self._scratch = None
        self._shards.append((tmp, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> None:
        if self._pending or not self._shards:
            self._flush()
        if len(self._shards) == 1:
            (self.dir / self._shards[0][0]).rename(self.dir / SINGLE_FILE)
            return
        weight_map = {}
        n = len(self._shards)
        for i, (tmp, names) in enumerate(self._shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (self.dir / tmp).rename(self.dir / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")

    def __enter__(self) -> HFWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self._scratch is not None:
            self._scratch.close()
            Path(self._scratch.name).unlink(missing_ok=True)


def _safetensors_header(tensors: dict, metadata: dict) -> tuple[bytes, list[str]]:
    """The header save_file writes for {name: (dtype, shape, _, bytes)}, and the data order.

    The order (dtype, then name) is taken from safetensors itself, by serialising empty tensors
    of the same names and dtypes, so it follows whatever the installed version does.
    """
    empty = save({n: torch.empty(0, dtype=v[0]) for n, v in tensors.items()}, metadata=metadata)
    layout = json.loads(empty[8 : 8 + int.from_bytes(empty[:8], "little")])
    order = [n for n in layout if n != "__metadata__"]
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        dtype, shape, _, size = tensors[name]
        header[name] = {
            "dtype": layout[name]["dtype"],
            "shape": shape,
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8), order


def _copy_range(src, dst, offset: int, size: int) -> None:
    """Append bytes [offset, offset + size) of file src to unbuffered file dst (in the kernel where it can)."""
    while size:
        try:
            done = os.copy_file_range(src.fileno(), dst.fileno(), size, offset)
        except OSError:
            src.seek(offset)
            done = dst.write(src.read(min(size, 64 << 20)))
        if done <= 0:
            raise OSError(f"copying {size} bytes from {src.name} to {dst.name} made no progress")
        offset, size = offset + done, size - done
