"""rl.experience.init_critic: the PPO critic starts from the policy's trunk with a zero head, so
its values are 0 on every token at the first step, and a policy of another shape is refused."""

from __future__ import annotations

import copy

import pytest
import torch

from vepo_mcore.config import JobConfig
from vepo_mcore.models.builder import build_model
from vepo_mcore.models.heads import ScalarHead, build_value_model
from vepo_mcore.parallel import init_model_parallel
from vepo_mcore.rl.experience import init_critic


def _cfg(tied: bool, layers: int = 2) -> JobConfig:
    c = JobConfig()
    m = c.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size = layers, 32, 64, 128
    m.num_attention_heads, m.num_query_groups = 4, 2
    m.tie_word_embeddings = tied
    init_model_parallel(c.parallel)
    return c


@pytest.mark.parametrize("tied", [True, False])
def test_critic_takes_every_policy_weight_but_the_lm_head_and_starts_at_zero(tied):
    cfg = _cfg(tied)
    torch.manual_seed(0)
    policy = build_model(cfg)
    torch.manual_seed(1)  # another init, so equality below comes from the copy
    critic = build_value_model(cfg)
    trunk = {
        k: v
        for k, v in policy.state_dict().items()
        if not k.startswith("output_layer.") and not k.endswith("_extra_state")
    }
    assert any(not torch.equal(v, critic.state_dict()[k]) for k, v in trunk.items())

    init_critic(critic, policy)
    state = critic.state_dict()
    for k, v in trunk.items():
        assert torch.equal(state[k], v), k
    assert isinstance(critic.output_layer, ScalarHead)
    assert not critic.output_layer.weight.any() and not critic.output_layer.bias.any()

    tokens = torch.randint(0, 128, (2, 8))
    positions = torch.arange(8).expand(2, 8)
    with torch.no_grad():
        values = critic(tokens, positions, None)
        assert values.shape == (2, 8, 1) and not values.any()
        # With a head, the critic reads the policy's final hidden states: set the head to one row of
        # the policy's LM head and the value is that token's logit.
        lm_head = policy.embedding.word_embeddings.weight if tied else policy.output_layer.weight
        critic.output_layer.weight.copy_(lm_head[5:6])
        logits = policy(tokens, positions, None)
        torch.testing.assert_close(critic(tokens, positions, None)[..., 0], logits[..., 5])


def test_a_policy_of_another_shape_is_refused():
    critic = build_value_model(_cfg(tied=True, layers=2))
    policy = build_model(copy.deepcopy(_cfg(tied=True, layers=3)))
    with pytest.raises(ValueError, match="does not fit its critic.*not in the model: decoder.layers.2"):
        init_critic(critic, policy)
