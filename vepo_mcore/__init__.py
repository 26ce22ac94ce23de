"""vepo_mcore: the VEPO pipeline (tokenizer expansion, CPT, SFT, VEPO RL, FLORES eval) on Megatron-Core."""

__version__ = "0.1.0"
