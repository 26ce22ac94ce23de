"""Load a model state dict that may lack Transformer Engine's `_extra_state` entries.

    load_model_state(model, loaded["model"])      # after dist_checkpointing.load

A TE layer's state dict carries `<module>._extra_state` (FP8 scaling metadata, a pickled object or
an empty tensor). A checkpoint written by the local layer spec, by HF conversion, or by a TE run
without FP8 may not hold them, so a strict `load_state_dict` fails on a TE model. megatron-core
0.16.1 handles this for its own models by dropping exactly the `_extra_state` keys from the missing
and unexpected lists (models/multimodal/llava_model.py, `_load_state_dict_hook_ignore_extra_state`),
as Megatron-based trainers load with strict=False; this does the same for any model and fails,
naming the keys, on any other mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

EXTRA_STATE_SUFFIX = "_extra_state"


def load_model_state(
    model: torch.nn.Module, state_dict: Mapping[str, object], missing_ok: tuple[str, ...] = ()
) -> list[str]:
    """model.load_state_dict(state_dict) where only `*._extra_state` keys may be missing or
    unexpected, and keys starting with one of `missing_ok` (a part the source does not have, e.g.
    "output_layer.") may be missing; returns those `missing_ok` keys, left at their initialisation.

    Any other missing or unexpected key raises a ValueError listing them (the shape checks of
    load_state_dict still raise as usual).
    """
    result = model.load_state_dict(state_dict, strict=False)
    absent = [k for k in result.missing_keys if not k.endswith(EXTRA_STATE_SUFFIX)]
    left = [k for k in absent if k.startswith(missing_ok)]
    missing = [k for k in absent if not k.startswith(missing_ok)]
    unexpected = [k for k in result.unexpected_keys if not k.endswith(EXTRA_STATE_SUFFIX)]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {_listing(missing)}")
        if unexpected:
            parts.append(f"in the checkpoint but not in the model: {_listing(unexpected)}")
        raise ValueError(
            f"checkpoint does not match the model ({'; '.join(parts)}); only Transformer Engine "
            f"'{EXTRA_STATE_SUFFIX}' entries may differ: check model.* settings (layers, heads, "
            "tie_word_embeddings, transformer_impl) against the checkpoint's config"
        )
    return left


def _listing(keys: list[str], shown: int = 8) -> str:
    more = f" ... (+{len(keys) - shown} more)" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
