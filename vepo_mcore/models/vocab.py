"""The one vocabulary padding rule (SPEC section 1). Conversion, resize and the builder call it."""

from __future__ import annotations


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tensor_parallel: int = 1) -> int:
    """Round `vocab_size` up to a multiple of `divisible_by * tensor_parallel`.

    Qwen2.5: padded_vocab_size(151665, 128, 4) == 152064, the row count of its HF checkpoints.
    Rows >= vocab_size are padding: zero, and excluded from softmax, loss, entropy and sampling.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if divisible_by <= 0 or tensor_parallel <= 0:
        raise ValueError(
            f"make_vocab_size_divisible_by ({divisible_by}) and tensor parallel size ({tensor_parallel}) "
            "must be positive"
        )
    multiple = divisible_by * tensor_parallel
    return -(-vocab_size // multiple) * multiple
