"""HF Qwen2 <-> megatron.core checkpoints: the weight-name mapping, conversion, resharding.

mapping.py   the one HF <-> megatron name/layout mapping (also used by the RL weight sync)
hf.py        HF directories: config.json <-> ModelConfig, lazy safetensors reader, sharded writer
convert.py   hf_to_megatron / megatron_to_hf, save/load_megatron_checkpoint (torch_dist)
reshard.py   rewrite a dist checkpoint at another TP/PP
testing.py   tiny random Qwen2 checkpoints and a TP/PP forward for tests
"""
