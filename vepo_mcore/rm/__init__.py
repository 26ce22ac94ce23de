"""The translation reward model (SPEC section 6): corrupted-reference pairs, Bradley-Terry plus
multi-label loss, training on the shared Megatron loop, scoring and evaluation.

    pairs = build_pairs("dev", langs, lines=range(50))                 # data.py
    history = train_rm(cfg, pairs, tokenizer, valid_pairs=held_out)    # train.py: training/trainer.py pretrain
    model, cfg, tokenizer = load_reward_model("ckpt/rm")               # model.py: GPTModel + 11-wide head
    report = evaluate_pairs(model, tokenizer, held_out, seq_length)    # evaluate.py
"""

NUM_OUTPUTS = 11
"""Head width: one preference score then one logit per error category (corruptions.CATEGORIES)."""
