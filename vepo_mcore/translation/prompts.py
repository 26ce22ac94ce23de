"""The translation task every layer above shares: the prompt template, ChatML prompt Samples for
FLORES sentences, and the one-line hypothesis a response becomes.

Used by RL prompts (rl.prompts), evaluation (eval.systems, eval.heldout), the reward model's data
(rm.data) and its reward term (rm.reward).
"""

from __future__ import annotations

from collections.abc import Sequence

from vepo_mcore.languages import language
from vepo_mcore.translation.directions import Direction
from vepo_mcore.translation.sample import Sample

DEFAULT_TEMPLATE = "Translate the following {src_name} text into {tgt_name}.\n\n{source}"
"""User turn of the translation prompt; fields: src_name tgt_name src tgt source."""


def format_prompt(
    direction: Direction,
    source: str,
    tokenizer,
    template: str = DEFAULT_TEMPLATE,
    system_prompt: str | None = None,
) -> str:
    """ChatML prompt text for one source sentence, ending with the assistant turn opener."""
    try:
        user = template.format(
            src_name=language(direction.src).name,
            tgt_name=language(direction.tgt).name,
            src=direction.src,
            tgt=direction.tgt,
            source=source,
        )
    except KeyError as exc:
        raise ValueError(
            f"prompt template field {exc} unknown; known: src_name tgt_name src tgt source"
        ) from None
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": user})
    return tokenizer.apply_chat(messages, add_generation_prompt=True)


def prompt_samples(
    direction: Direction,
    sources: Sequence[str],
    tokenizer,
    references: Sequence[str] | None = None,
    template: str = DEFAULT_TEMPLATE,
    system_prompt: str | None = None,
    indices: Sequence[int] | None = None,
) -> list[Sample]:
    """Prompt Samples (ChatML text and ids, source, reference, languages) for sources[i], i in indices
    (default: all); group_id and metadata["index"] are i."""
    samples = []
    for i in range(len(sources)) if indices is None else indices:
        text = format_prompt(direction, sources[i], tokenizer, template, system_prompt)
        samples.append(
            Sample(
                prompt=text,
                prompt_ids=tokenizer.encode(text),
                source=sources[i],
                reference=references[i] if references is not None else None,
                src_lang=direction.src,
                tgt_lang=direction.tgt,
                group_id=i,
                metadata={"direction": str(direction), "index": i},
            )
        )
    return samples


def clean_hypothesis(text: str) -> str:
    """One line per hypothesis: newlines inside a response become spaces; ends stripped."""
    return " ".join(text.split("\n")).strip()
