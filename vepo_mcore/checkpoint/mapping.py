"""The one weight-name mapping between Hugging Face Qwen2 and megatron.core's GPTModel.

Conversion (convert.py) and the RL weight sync to SGLang (which takes HF names) both use it:

    for hf_name, tensor in megatron_to_hf_tensors(full_state_dict, model_cfg): ...
    full = hf_to_megatron_tensor("decoder.layers.3.self_attention.linear_qkv.weight", get_hf, model_cfg)

Tensors here are *full* (TP-gathered) tensors and layer numbers are *global*. `tp_split` /
`tp_merge` cut a full tensor into megatron's TP shards and back. Both megatron name sets are
understood: the local spec's `input_layernorm.weight` / `pre_mlp_layernorm.weight` and Transformer
Engine's fused `linear_qkv.layer_norm_weight` / `linear_fc1.layer_norm_weight`; `_extra_state`
entries carry no weights and are skipped.

Layouts (h = hidden, d = head_dim, n = query heads, g = query groups, f = ffn_hidden_size):
  linear_qkv.weight [g * (n/g + 2) * d, h]: per group [q_1 .. q_{n/g}, k, v] (megatron's order)
  linear_fc1.weight [2f, h]: [gate; up]; each TP rank holds [gate_r; up_r]
  word_embeddings / output_layer [padded_vocab, h]: rows >= the real vocab are zero padding
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from vepo_mcore.config.model import ModelConfig

HF_LAYER = "model.layers.{layer}."
MCORE_LAYER = "decoder.layers.{layer}."


@dataclass(frozen=True)
class Rule:
    """How one megatron tensor is made of HF tensors.

    kind: 'copy' (same tensor), 'qkv' (q,k,v fused per query group), 'gate_up' ([gate; up]),
    'vocab' (rows = vocabulary, padded). tp: how megatron shards it across TP ranks:
    'column' (dim 0), 'row' (dim 1), 'gate_up' (gate and up halves each split on dim 0),
    None (replicated).
    """

    megatron: str
    hf: tuple[str, ...]
    kind: str
    tp: str | None


# Per-layer rules; names are relative to MCORE_LAYER / HF_LAYER.
LAYER_RULES = (
    Rule("input_layernorm.weight", ("input_layernorm.weight",), "copy", None),
    Rule(
        "self_attention.linear_qkv.weight",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
        "column",
    ),
    Rule(
        "self_attention.linear_qkv.bias",
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
        "column",
    ),
    Rule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "copy", "row"),
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "copy", None),
    Rule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate_up", "gate_up"),
    Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "copy", "row"),
)

# Transformer Engine fuses the layer norms into the following linear layer.
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}

GLOBAL_RULES = (
    Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab", "column"),
    Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", None),
    Rule("output_layer.weight", ("lm_head.weight",), "vocab", "column"),
)

_LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def _rules_by_name() -> dict[str, Rule]:
    return {r.megatron: r for r in LAYER_RULES}


def parse_megatron_name(name: str) -> tuple[int | None, Rule]:
    """'decoder.layers.3.mlp.linear_fc1.weight' -> (3, its Rule); global tensors -> (None, Rule).

    Accepts the local-spec and the Transformer Engine names. Unknown names raise a ValueError.
    """
    match = _LAYER_NAME.match(name)
    if match:
        layer, suffix = int(match.group(1)), match.group(2)
        suffix = TE_ALIASES.get(suffix, suffix)
        rule = _rules_by_name().get(suffix)
        if rule is not None:
            return layer, rule
    else:
        for rule in GLOBAL_RULES:
            if rule.megatron == name:
                return None, rule
    known = [MCORE_LAYER + r.megatron for r in LAYER_RULES] + [MCORE_LAYER + k for k in TE_ALIASES]
    known += [r.megatron for r in GLOBAL_RULES]
    raise ValueError(f"unknown megatron tensor name {name!r}; known names are {known}")


def global_layer_name(name: str, layer_offset: int) -> str:
    """Renumber a pipeline stage's local layer name to the global one ('decoder.layers.0.' + offset)."""
    match = _LAYER_NAME.match(name)
    if match is None or layer_offset == 0:
        return name
    return f"decoder.layers.{int(match.group(1)) + layer_offset}.{match.group(2)}"


def is_weightless(name: str) -> bool:
    """Entries of a megatron state dict that are not weights (Transformer Engine's FP8 metadata)."""
    return name.endswith("_extra_state")


def hf_names_for(name: str, cfg: ModelConfig) -> tuple[str, ...]:
    """HF tensor names a megatron tensor is built from (global layer numbering)."""
    layer, rule = parse_megatron_name(name)
    if layer is not None:
        return tuple(HF_LAYER.format(layer=layer) + n for n in rule.hf)
    if rule.megatron == "output_layer.weight" and cfg.tie_word_embeddings:
        return ("model.embed_tokens.weight",)
    return rule.hf


def megatron_names(cfg: ModelConfig) -> list[str]:
    """Every megatron weight name of a full (unsharded, all stages) model, in forward order."""
    names = ["embedding.word_embeddings.weight"]
    for layer in range(cfg.num_layers):
        for rule in LAYER_RULES:
            if rule.megatron.endswith(".bias") and not cfg.add_qkv_bias:
                continue
            names.append(MCORE_LAYER.format(layer=layer) + rule.megatron)
    names.append("decoder.final_layernorm.weight")
    if not cfg.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


# ----------------------------------------------------------------------------- layout helpers


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_groups: int
) -> torch.Tensor:
    """q [n*d, ...], k [g*d, ...], v [g*d, ...] -> megatron's [g * (n/g + 2) * d, ...].

    Per query group the rows are that group's n/g query heads, then its key head, then its
    value head. Works for weights ([*, h]) and biases ([*]).
    """
    head_dim = k.shape[0] // num_groups
    heads_per_group = num_heads // num_groups
    rest = q.shape[1:]
    q = q.reshape(num_groups, heads_per_group * head_dim, *rest)
    k = k.reshape(num_groups, head_dim, *rest)
    v = v.reshape(num_groups, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(
    qkv: torch.Tensor, num_heads: int, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of fuse_qkv: [g * (n/g + 2) * d, ...] -> (q [n*d, ...], k [g*d, ...], v [g*d, ...])."""
    heads_per_group = num_heads // num_groups
    head_dim = qkv.shape[0] // (num_groups * (heads_per_group + 2))
    rest = qkv.shape[1:]
    grouped = qkv.reshape(num_groups, (heads_per_group + 2) * head_dim, *rest)
    q, k, v = torch.split(grouped, [heads_per_group * head_dim, head_dim, head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate [f, h], up [f, h] -> linear_fc1 [2f, h] = [gate; up]."""
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """linear_fc1 [2f, h] -> (gate [f, h], up [f, h])."""
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate, up


def pad_vocab_rows(weight: torch.Tensor, real_vocab: int, rows: int) -> torch.Tensor:
    """Keep the first `real_vocab` rows of [V, h] and zero-fill (or cut) to `rows` rows.

    Rows >= real_vocab are padding: never copied, always zero, so they never leak between formats.
    """
    if weight.shape[0] < real_vocab:
        raise ValueError(f"embedding has {weight.shape[0]} rows, fewer than the real vocab size {real_vocab}")
    if rows < real_vocab:
        raise ValueError(f"cannot write {rows} vocab rows: the real vocab size is {real_vocab}")
    out = weight.new_zeros((rows, *weight.shape[1:]))
    out[:real_vocab] = weight[:real_vocab]
    return out


# ----------------------------------------------------------------------------- tensor parallel


def tp_split(name: str, full: torch.Tensor, tp_size: int) -> list[torch.Tensor]:
    """Cut a full megatron tensor into its `tp_size` TP shards (rank order)."""
    _, rule = parse_megatron_name(name)
    if rule.tp is None or tp_size == 1:
        return [full] * tp_size
    if rule.tp == "column":
        return list(torch.chunk(full, tp_size, dim=0))
    if rule.tp == "row":
        return list(torch.chunk(full, tp_size, dim=1))
    gate, up = split_gate_up(full)
    return [torch.cat(parts, dim=0) for parts in zip(torch.chunk(gate, tp_size), torch.chunk(up, tp_size))]


def tp_merge(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of tp_split: TP shards in rank order -> the full tensor."""
    _, rule = parse_megatron_name(name)
    if rule.tp is None or len(shards) == 1:
        return shards[0]
    if rule.tp == "column":
        return torch.cat(shards, dim=0)
    if rule.tp == "row":
        return torch.cat(shards, dim=1)
    halves = [split_gate_up(s) for s in shards]
    return fuse_gate_up(torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves]))


# ----------------------------------------------------------------------------- conversions


def hf_to_megatron_tensor(
    name: str, get_hf: Callable[[str], torch.Tensor], cfg: ModelConfig, padded_vocab: int
) -> torch.Tensor:
    """The full megatron tensor `name` built from HF tensors fetched lazily by `get_hf(hf_name)`.

    Vocab tensors keep the first cfg.vocab_size rows and are zero-padded to `padded_vocab` rows.
    """
    _, rule = parse_megatron_name(name)
    parts = [get_hf(n) for n in hf_names_for(name, cfg)]
    if rule.kind == "qkv":
        return fuse_qkv(*parts, cfg.num_attention_heads, cfg.num_query_groups)
    if rule.kind == "gate_up":
        return fuse_gate_up(*parts)
    if rule.kind == "vocab":
        return pad_vocab_rows(parts[0], cfg.vocab_size, padded_vocab)
    return parts[0]


def megatron_to_hf_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor],
    cfg: ModelConfig,
    hf_vocab_rows: int | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full megatron tensors (global layer numbers, either name set) -> (hf_name, tensor), lazily.

    Vocab tensors keep cfg.vocab_size real rows and are zero-padded to `hf_vocab_rows`
    (default: the megatron row count). With tied embeddings the output layer is not emitted
    (HF ties lm_head to embed_tokens). A model without qkv bias emits zero q/k/v biases, since
    HF Qwen2 always has them. `_extra_state` entries are skipped.
    """
    items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors
    for name, tensor in items:
        if is_weightless(name):
            continue
        layer, rule = parse_megatron_name(name)
        if rule.megatron == "output_layer.weight" and cfg.tie_word_embeddings:
            continue
        hf_names = hf_names_for(name, cfg)
        if rule.kind == "qkv":
            yield from zip(hf_names, split_qkv(tensor, cfg.num_attention_heads, cfg.num_query_groups))
            if name.endswith("weight") and not cfg.add_qkv_bias:
                yield from _zero_qkv_biases(layer, tensor, cfg)
        elif rule.kind == "gate_up":
            yield from zip(hf_names, split_gate_up(tensor))
        elif rule.kind == "vocab":
            rows = hf_vocab_rows if hf_vocab_rows is not None else tensor.shape[0]
            yield hf_names[0], pad_vocab_rows(tensor, cfg.vocab_size, rows)
        else:
            yield hf_names[0], tensor


def _zero_qkv_biases(
    layer: int, weight: torch.Tensor, cfg: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    prefix = HF_LAYER.format(layer=layer) + "self_attn."
    d = cfg.head_dim
    sizes = {
        "q_proj": cfg.num_attention_heads * d,
        "k_proj": cfg.num_query_groups * d,
        "v_proj": cfg.num_query_groups * d,
    }
    for proj, size in sizes.items():
        yield f"{prefix}{proj}.bias", weight.new_zeros(size)


def mapping_table(cfg: ModelConfig) -> list[tuple[str, tuple[str, ...], str, str]]:
    """(megatron name, HF names, how, TP split) for every tensor: what `--dry-run` prints."""
    rows = []
    for name in megatron_names(cfg):
        _, rule = parse_megatron_name(name)
        rows.append((name, hf_names_for(name, cfg), rule.kind, rule.tp or "replicated"))
    return rows
