"""The translation reward model (SPEC section 6): corrupted-reference pairs, Bradley-Terry plus
multi-label loss, training on the shared Megatron loop, scoring and evaluation.

    pairs = build_pairs("dev", langs, lines=50)          # data.py
    model = build_reward_model(cfg)                      # model.py: GPTModel + ScalarHead(11)
    metrics = train_step(rm_forward_step, ...)           # loss.py forward_step for training/loop.py
    report = evaluate_pairs(model, tokenizer, pairs)     # evaluate.py
"""

NUM_OUTPUTS = 11
"""Head width: one preference score then one logit per error category (corruptions.CATEGORIES)."""
