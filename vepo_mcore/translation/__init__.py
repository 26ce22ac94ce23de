"""The translation task below every consumer: directions, the Sample record, prompts."""
