"""The training loop shared by CPT, SFT and RL (megatron.core schedules, DDP, optimizer, checkpoints).

    runner.py         run_training: the one loop every job plugs a step into (lock, resume line, log, eval,
                      save cadence, teardown in a finally); check_vocab
    trainer.py        pretrain(cfg): CPT/SFT/RM as LMTrainer in that loop; train_step(...) for one optimizer
                      step (RL reuses it)
    curves.py         plot_curves: metrics per step as PNG (RL and reward-model runs)
    forward.py        forward_step(data_iterator, model) -> (output, loss_func) with exact token averaging
    optimizer.py      wrap_model (Float16Module + DDP), build_optimizer, build_scheduler
    checkpointing.py  save_checkpoint / load_checkpoint: atomic torch_dist checkpoints with full resume state,
                      integrity.json checked on load (fallback to the newest intact checkpoint)
    writer_lock.py    save_folder_lock: one run writes a save folder at a time
    sampler.py        which samples a DP rank reads, as a function of the global data position
    logging.py        MetricsLogger: rank-0 progress bar, tensorboard, JSONL, tokens/s, ETA, MFU
    synthetic.py      SyntheticTokens, a random-token dataset in GPTDataset's sample format

Submodules import megatron.core lazily; importing this package is cheap.
"""
