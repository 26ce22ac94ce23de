"""The toy recipe: the paper's whole chain (tokenizer -> resize -> CPT -> SFT -> RL -> held-out
evaluation) on 2 CPU cores; `tools/run_toy.py`, `recipes/toy/configs/`, `reports/toy/`."""
