"""The project tokenizer: a thin wrapper over a `tokenizers` tokenizer.json (Qwen2.5 or expanded).

tok = load_tokenizer()            # shipped Qwen2.5 tokenizer, 151,665 ids
ids = tok.encode("Hello")         # no special tokens added
text = tok.apply_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from vepo_mcore.languages import default_tokenizer_dir

EOD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class Tokenizer:
    """Byte-level BPE tokenizer with the ChatML special tokens of Qwen2.5."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_tokenizer_dir()
        file = self.path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer directory {self.path} has no tokenizer.json")
        self._tok = HFTokenizer.from_file(str(file))
        self.eod_id = self._required_id(EOD_TOKEN)
        self.im_start_id = self._required_id(IM_START)
        self.im_end_id = self._required_id(IM_END)
        self.pad_id = self.eod_id

    def _required_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer {self.path} lacks the special token {token}")
        return token_id

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (151,665 for Qwen2.5)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a generated response."""
        return (self.im_end_id, self.eod_id)

    @property
    def backend(self) -> HFTokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """ChatML text: `<|im_start|>role\\ncontent<|im_end|>\\n` per message."""
        parts = []
        for i, msg in enumerate(messages):
            if "role" not in msg or "content" not in msg:
                raise ValueError(f"chat message {i} needs 'role' and 'content' keys, got {sorted(msg)}")
            parts.append(f"{IM_START}{msg['role']}\n{msg['content']}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts)

    def config(self) -> dict:
        """tokenizer_config.json of the directory (empty if absent)."""
        file = self.path / "tokenizer_config.json"
        return json.loads(file.read_text()) if file.is_file() else {}


@lru_cache(maxsize=8)
def _cached(path: str | None) -> Tokenizer:
    return Tokenizer(path)


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """Load (and cache per process) the tokenizer at `path`, or the shipped Qwen2.5 one."""
    return _cached(str(path) if path is not None else None)
