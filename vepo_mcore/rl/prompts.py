"""RL prompts: FLORES translation requests in ChatML over the configured directions.

    prompts = TranslationPrompts(tokenizer, directions="all", split="dev", seed=1234, sentences="800:")
    batch = prompts.next_batch(8)          # list[Sample] with prompt, prompt_ids, source, reference
    state = prompts.state_dict()           # saved in RL checkpoints; resume continues exactly

The order is a seeded permutation of (direction, sentence) pairs, re-shuffled every epoch, so
each step mixes directions. The prompt text comes from the one template evaluation uses
(vepo_mcore.translation.prompts.format_prompt).
"""

from __future__ import annotations

import random

from vepo_mcore.languages import load_flores, sentence_range
from vepo_mcore.translation.directions import Direction, parse_directions
from vepo_mcore.translation.prompts import DEFAULT_TEMPLATE, format_prompt
from vepo_mcore.translation.sample import Sample


class TranslationPrompts:
    """An endless, resumable stream of translation prompts."""

    def __init__(
        self,
        tokenizer,
        directions: str = "all",
        split: str = "dev",
        seed: int = 1234,
        max_sentences: int | None = None,
        template: str = DEFAULT_TEMPLATE,
        sentences: str = ":",
    ):
        self.tokenizer = tokenizer
        self.template = template
        self.directions = parse_directions(directions)
        langs = sorted({d.src for d in self.directions} | {d.tgt for d in self.directions})
        self.text = {lang: load_flores(lang, split)[:max_sentences] for lang in langs}
        n = min(len(lines) for lines in self.text.values())
        indices = range(n)[sentence_range(sentences)]  # FLORES line numbers, kept in the metadata
        if not indices:
            raise ValueError(f"rl.prompt_sentences {sentences!r} selects none of the {n} {split} sentences")
        self.items = [(d, i) for d in self.directions for i in indices]
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(len(self.items)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def sample(self, direction: Direction, index: int, group_id: int) -> Sample:
        source = self.text[direction.src][index]
        prompt = format_prompt(direction, source, self.tokenizer, self.template)
        return Sample(
            prompt=prompt,
            prompt_ids=self.tokenizer.encode(prompt),
            source=source,
            reference=self.text[direction.tgt][index],
            src_lang=direction.src,
            tgt_lang=direction.tgt,
            group_id=group_id,
            metadata={"direction": str(direction), "index": index},
        )

    def next_batch(self, num_prompts: int, first_group_id: int = 0) -> list[Sample]:
        """The next `num_prompts` prompts, group ids counting up from `first_group_id`."""
        batch = []
        for k in range(num_prompts):
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            direction, index = self.items[self._order[self.position]]
            self.position += 1
            batch.append(self.sample(direction, index, first_group_id + k))
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.items)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("size") != len(self.items) or state.get("seed") != self.seed:
            raise ValueError(
                f"prompt iterator state {state} does not match this prompt set "
                f"(size {len(self.items)}, seed {self.seed}): rl.directions / rl.prompt_split / rl.prompt_sentences / seed changed"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()
