"""Adding an algorithm, a reward term or a rollout engine is one file plus one registration: a toy
of each, registered here, is found by name through the same entry points the trainer uses."""

from dataclasses import dataclass

import pytest
import torch

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.config.rl import LOSS_OPTIONS
from vepo_mcore.rewards import registry as rewards
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses import LOSSES, compute_loss, get_loss, register_loss
from vepo_mcore.rl.trainer import rl_job_config
from vepo_mcore.rollout import base as engines
from vepo_mcore.translation.sample import Sample


@pytest.fixture
def toy_loss():
    @register_loss(
        "toy_sign", advantages=lambda batch, cfg, kl=None: torch.sign(batch.rewards)[:, None] * batch.mask
    )
    def toy_sign(batch, cfg, kl=None):
        adv = torch.sign(batch.rewards)[:, None] * batch.mask
        return -(adv * batch.logp).sum() / batch.mask.sum(), {}

    yield "toy_sign"
    LOSSES.pop("toy_sign")


def test_a_registered_loss_runs_by_name_and_passes_the_config_check(toy_loss):
    cfg = JobConfig()
    cfg.rl.loss.name = toy_loss
    rl_job_config(cfg)  # an unknown name would be a ValueError here
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    batch = RLBatch(logp=logp, old_logp=logp.detach(), mask=torch.ones(2, 2, dtype=torch.bool),
                    rewards=torch.tensor([1.0, -1.0]))  # fmt: skip
    loss, _ = compute_loss(batch, cfg.rl.loss)
    assert loss.item() == pytest.approx(-((-1.0 - 2.0) - (-0.5 - 0.1)) / 4)
    assert not get_loss(toy_loss).needs_critic and get_loss("ppo").needs_critic
    cfg.rl.loss.name = "toy_sign_typo"
    with pytest.raises(ValueError, match="unknown rl.loss.name 'toy_sign_typo'"):
        rl_job_config(cfg)


@dataclass(kw_only=True)
class ToyScaledOptions:
    """The toy loss's own options (rl.loss.toy_scaled)."""

    scale: float = 1.0
    """Multiplies the loss."""

    def validate(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"rl.loss.toy_scaled.scale must be > 0, got {self.scale}")


def test_a_loss_with_its_own_options_is_one_file_and_one_registration():
    """A loss's options dataclass, registered with it, is the config section rl.loss.<name>: set by a
    dotted flag, validated when the loss is selected, read by the loss; nothing else changes."""

    def sign_advantages(batch, cfg, kl=None):
        return torch.sign(batch.rewards)[:, None] * batch.mask

    @register_loss("toy_scaled", advantages=sign_advantages, options=ToyScaledOptions)
    def toy_scaled(batch, cfg, kl=None):
        scale = cfg.options_of("toy_scaled").scale
        return -scale * (sign_advantages(batch, cfg) * batch.logp).sum() / batch.mask.sum(), {}

    try:
        flags = ["--rl.loss.name", "toy_scaled", "--rl.loss.toy_scaled.scale", "3"]
        cfg = rl_job_config(load_config(JobConfig, None, flags))
        assert cfg.rl.loss.options_of() == ToyScaledOptions(scale=3.0)
        logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
        batch = RLBatch(logp=logp, old_logp=logp.detach(), mask=torch.ones(2, 2, dtype=torch.bool),
                        rewards=torch.tensor([1.0, -1.0]))  # fmt: skip
        loss, _ = compute_loss(batch, cfg.rl.loss)
        assert loss.item() == pytest.approx(-3 * ((-1.0 - 2.0) - (-0.5 - 0.1)) / 4)
        with pytest.raises(ValueError, match=r"rl\.loss\.toy_scaled\.scale must be > 0"):
            load_config(JobConfig, None, [*flags[:2], "--rl.loss.toy_scaled.scale", "0"])
        with pytest.raises(ValueError, match=r"rl\.loss\.toy_scaled: unknown key\(s\) \['sclae'\]"):
            load_config(JobConfig, None, [*flags[:2], "--rl.loss.toy_scaled.sclae", "2"])
        # a section named after no registered loss fails at start-up, listing the losses with options
        stray = load_config(JobConfig, None, [*flags, "--rl.loss.toy_scaledd.scale", "2"])
        with pytest.raises(ValueError, match=r"rl\.loss\.toy_scaledd: no registered loss .*'toy_scaled'"):
            rl_job_config(stray)
    finally:
        LOSSES.pop("toy_scaled")
        LOSS_OPTIONS.pop("toy_scaled")


def test_a_registered_reward_term_runs_by_name():
    @rewards.register_reward("toy_len")
    def toy_len(samples):
        return [float(len(s.response)) for s in samples]

    try:
        samples = [Sample(response="abc"), Sample(response="")]
        result = rewards.run_reward("toy_len", samples, RewardsConfig())
        assert result.values == [3.0, 0.0] and "toy_len" in rewards.registered_rewards()
        # a registered term is also an MT metric: rewards.mt names it
        assert rewards.run_reward("mt", samples, RewardsConfig(mt="toy_len")).values == [3.0, 0.0]
    finally:
        rewards._REWARDS.pop("toy_len")


def test_a_registered_engine_is_built_by_name():
    class Echo:
        shares_training_weights = True

    @engines.register_engine("toy_echo")
    def build(cfg, model=None, tokenizer=None, **kwargs):
        return Echo()

    try:
        cfg = JobConfig()
        cfg.rl.rollout.engine = "toy_echo"
        assert isinstance(engines.build_engine(cfg), Echo)
        assert "toy_echo" in engines.known_engines()
    finally:
        engines._ENGINES.pop("toy_echo")


@pytest.mark.parametrize("registry", ["loss", "reward", "engine", "source"])
def test_every_registry_refuses_a_name_already_registered(registry):
    """One rule for every registry: a second registration under a taken name is a ValueError naming
    the module that holds it, never a silent overwrite."""
    from vepo_mcore.bitext import sources

    register = {
        "loss": lambda: register_loss("vepo", advantages=lambda *a: None),
        "reward": lambda: rewards.register_reward("length"),
        "engine": lambda: engines.register_engine("embedded"),
        "source": lambda: sources.register_source(name=next(iter(sources.SOURCES))),
    }[registry]
    before = {
        "loss": dict(LOSSES),
        "reward": dict(rewards._REWARDS),
        "engine": dict(engines._ENGINES),
        "source": dict(sources.SOURCES),
    }[registry]
    with pytest.raises(ValueError, match="already registered by vepo_mcore"):
        register()(lambda *a, **k: None)
    after = {
        "loss": LOSSES,
        "reward": rewards._REWARDS,
        "engine": engines._ENGINES,
        "source": sources.SOURCES,
    }[registry]
    assert dict(after) == before
