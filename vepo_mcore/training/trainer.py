"""The LM trainer (CPT, SFT, the reward model) and the optimizer step every trainer shares: one step =
megatron's forward-backward schedule over the micro-batches of a global batch, then clip + step + LR
schedule. The loop around the steps is training/runner.py's.

    history = pretrain(cfg, train_dataset)        # whole run: build, resume, loop, checkpoint, log

`LMTrainer` is the CPT/SFT/RM step in training/runner.py's loop (which RL shares);
`train_step(...)` is the reusable optimizer step (the RL trainer passes its own forward_step / loss).
A dataset is map-style (len + getitem -> dict of [s] tensors, e.g. megatron.core's GPTDataset
or BlendedDataset); which samples a DP rank reads is fixed by the global data position
(training/sampler.py), so resume is exact and may change the DP size.
megatron.core (and data/packing.py, which loads it) is imported inside the functions: importing
the trainers loads no megatron (tests/unit/test_lazy_imports.py), so a run can take the save
folder's writer lock (training/runner.py) before megatron and its import-time notices: pretrain()
and the RL trainer build everything, init_model_parallel included, inside the lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.blend import build_cpt_datasets, format_share, language_blend, realised_language_share
from vepo_mcore.data.sft_splits import build_sft_splits
from vepo_mcore.languages import default_tokenizer_dir
from vepo_mcore.models.builder import build_model, use_transformer_engine
from vepo_mcore.parallel import init_model_parallel
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.checkpointing import load_checkpoint, resolve_checkpoint, save_checkpoint
from vepo_mcore.training.forward import forward_step as lm_forward_step
from vepo_mcore.training.optimizer import build_optimizer, build_scheduler, wrap_model
from vepo_mcore.training.runner import check_vocab, run_training
from vepo_mcore.training.sampler import micro_batches

# Imported where used: megatron.core and vepo_mcore.data.packing (pulls megatron.core; lock order: importing
# this module must load no megatron, so that a run can take the save folder's lock first and refuse a second
# launch in seconds).


def train_step(
    forward_step_func: Callable,
    data_iterator: Iterator[dict],
    model: torch.nn.Module,
    optimizer,
    scheduler,
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
) -> dict[str, float]:
    """One optimizer step over `num_microbatches` micro-batches of this rank (any PP size).

    Returns the reported metrics on every rank: each loss_func entry reduced over micro-batches
    and DP ranks ([sum, count] pairs as sum/count, scalars as a mean), plus grad_norm, lr, skipped.
    """
    model.zero_grad_buffer()
    optimizer.zero_grad()
    reports = _schedule(
        forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size, False
    )
    lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it after)
    ok, grad_norm, _ = optimizer.step()
    if ok:
        scheduler.step(increment=1)
    metrics = reduce_reports(reports)
    metrics["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
    metrics["lr"] = lr
    metrics["skipped"] = float(not ok)
    return metrics


def _schedule(
    forward_step_func: Callable,
    data_iterator: Iterator[dict],
    model,
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    forward_only: bool,
) -> list[dict[str, torch.Tensor]]:
    """megatron.core's pipeline schedule for this PP size: the loss_func reports of the micro-batches."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step_func,
        data_iterator=data_iterator,
        model=[model],
        num_microbatches=num_microbatches,
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )


def reduce_reports(reports: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Per-micro-batch loss_func reports (last PP stage) -> metrics on every rank of the step.

    A 2-element tensor is a [sum, count] pair (exact token averages); anything else is averaged.
    """
    from megatron.core import parallel_state as ps

    metrics: dict[str, float] = {}
    if ps.is_pipeline_last_stage(ignore_virtual=True) and reports:
        for key in sorted(reports[0]):
            values = torch.stack([r[key].float().reshape(-1) for r in reports])
            if values.shape[1] == 2:
                total = values.sum(0)
            else:
                total = torch.stack([values.mean(), torch.tensor(1.0, device=values.device)])
            dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
            metrics[key] = (total[0] / total[1].clamp(min=1)).item()
    if ps.get_pipeline_model_parallel_world_size() > 1:
        box = [metrics]
        dist.broadcast_object_list(
            box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        metrics = box[0]
    return metrics


def evaluate(
    forward_step_func: Callable,
    data_iterator: Iterator[dict],
    model,
    num_microbatches: int,
    cfg: JobConfig,
    rows_per_sample: int = 1,
) -> dict[str, float]:
    """Forward-only pass over `num_microbatches` micro-batches; token-averaged metrics."""
    from vepo_mcore.data.packing import schedule_shape

    seq_length, micro_batch_size = schedule_shape(cfg, rows_per_sample)
    model.eval()
    with torch.no_grad():
        reports = _schedule(
            forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size, True
        )
    model.train()
    return reduce_reports(reports)


def num_microbatches(cfg: JobConfig, data_parallel_size: int) -> int:
    """Gradient-accumulation steps: global batch / (micro batch * DP)."""
    cfg.training.validate(data_parallel_size)
    return cfg.training.global_batch_size // (cfg.training.micro_batch_size * data_parallel_size)


def pretrain(
    cfg: JobConfig,
    train_dataset: Sequence[dict] | None = None,
    valid_dataset: Sequence[dict] | None = None,
    forward_step_func: Callable = lm_forward_step,
    tokenizer_dir: str | None = None,
    model_provider: Callable[[JobConfig], torch.nn.Module] | None = None,
) -> list[dict[str, float]]:
    """Build the model, resume if a checkpoint exists, train to training.train_iters, checkpoint.

    Datasets default to the ones the config describes (data.mode cpt/sft). `model_provider(cfg)`
    builds (and may initialise) this rank's stage, default models.builder.build_model; the reward
    model passes its own. A dataset whose items hold several sequences (the RM's pairs) says so in
    `rows_per_sample`. Returns the per-step metrics of the steps run in this call (on every rank).
    """

    def build() -> LMTrainer:  # inside the save folder's lock: megatron loads only after it is taken
        init_model_parallel(cfg.parallel, seed=cfg.training.seed)  # validates cfg.parallel first (no VPP)
        cfg.validate(dist.get_world_size())
        return LMTrainer(cfg, train_dataset, valid_dataset, forward_step_func, tokenizer_dir, model_provider)

    return run_training(cfg.training.checkpoint, build, cfg.training.logging)


class LMTrainer:
    """CPT, SFT and the reward model in training/runner.py's loop: one optimizer step per global batch
    of a map-style dataset, read from the global data position (resume is exact at any DP size)."""

    def __init__(
        self,
        cfg: JobConfig,
        train_dataset: Sequence[dict] | None,
        valid_dataset: Sequence[dict] | None,
        forward_step_func: Callable,
        tokenizer_dir: str | None,
        model_provider: Callable[[JobConfig], torch.nn.Module] | None,
    ):
        from megatron.core import parallel_state as ps

        t = cfg.training
        if train_dataset is None:
            train_dataset, valid_dataset, tokenizer_dir = default_datasets(cfg)
        if tokenizer_dir is not None:
            check_vocab(cfg.model.vocab_size, len(load_tokenizer(tokenizer_dir)), tokenizer_dir)
        self.cfg, self.forward_step_func, self.tokenizer_dir = cfg, forward_step_func, tokenizer_dir
        self.train_dataset, self.valid_dataset = train_dataset, valid_dataset
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.n_micro = num_microbatches(cfg, self.dp_size)
        self.log_interval = t.logging.log_interval
        self.flops_per_token = None  # the config's model, trained on every token

        self.model = wrap_model((model_provider or build_model)(cfg), cfg)
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.iteration, self.consumed, self.resumed_from = 0, 0, None
        state = resume_or_initialise(cfg, self.model, self.optimizer, self.scheduler)
        if state is not None:
            self.iteration, self.consumed, self.resumed_from = (
                state.iteration,
                state.consumed_samples,
                state.path,
            )
        self.data = micro_batches(
            train_dataset, self.consumed, t.micro_batch_size, self.dp_rank, self.dp_size
        )
        self.rows = getattr(
            train_dataset, "rows_per_sample", 1
        )  # sequences per sample: megatron's p2p shapes

    @property
    def consumed_samples(self) -> int:
        return self.consumed

    def describe(self) -> str:
        line = describe_run(self.cfg, self.train_dataset, self.dp_size, self.n_micro, self.iteration)
        if self.cfg.training.eval_interval and self.valid_dataset is None:
            line += "\nno validation set (data.split gives validation nothing): no evaluation runs"
        return line

    def step(self) -> tuple[dict[str, float], int]:
        from vepo_mcore.data.packing import schedule_shape

        t = self.cfg.training
        metrics = train_step(
            self.forward_step_func, self.data, self.model, self.optimizer, self.scheduler,
            self.n_micro, *schedule_shape(self.cfg, self.rows),  # [T, 1, h] between stages under THD
        )  # fmt: skip
        self.iteration, self.consumed = self.iteration + 1, self.consumed + t.global_batch_size
        row = {f"train/{k}": v for k, v in metrics.items()}
        if hasattr(self.train_dataset, "phase_of"):  # SFT curriculum: which phase the step came from
            row["data/phase"] = float(
                self.train_dataset.phase_of((self.consumed - 1) % len(self.train_dataset))[0]
            )
        return row, t.global_batch_size * self.rows * t.seq_length

    def evaluate(self) -> dict[str, float] | None:
        if self.valid_dataset is None:
            return None
        t = self.cfg.training
        valid = micro_batches(self.valid_dataset, 0, t.micro_batch_size, self.dp_rank, self.dp_size)
        return evaluate(
            self.forward_step_func, valid, self.model, t.eval_iters * self.n_micro, self.cfg, self.rows
        )

    def save(self) -> None:
        ckpt = self.cfg.training.checkpoint
        save_checkpoint(
            ckpt.save, self.iteration, self.model, self.optimizer, self.scheduler, consumed_samples=self.consumed,
            config=self.cfg, tokenizer_dir=self.tokenizer_dir, keep_last=ckpt.keep_last, async_save=ckpt.async_save,
        )  # fmt: skip

    def finish(self, history: list[dict[str, float]]) -> None:
        pass

    def close(self) -> None:
        pass


def resumes_own_checkpoint(cfg: JobConfig) -> bool:
    """Whether the run restarts from its own checkpoint (training.checkpoint.save holds one)."""
    save = cfg.training.checkpoint.save
    # Quiet: resume_or_initialise reports a fallback when it loads.
    return bool(save) and resolve_checkpoint(save, warn=lambda text: None) is not None


def resume_or_initialise(cfg: JobConfig, model, optimizer, scheduler):
    """A run's own checkpoint (training.checkpoint.save) wins: a relaunch after a crash resumes there
    with full state. Otherwise training.checkpoint.load initialises the run (weights only when
    finetune is set or the checkpoint has no optimizer, e.g. converted from HF). Returns the
    LoadedState, or None for a fresh start."""
    ckpt = cfg.training.checkpoint
    if resumes_own_checkpoint(cfg):
        return load_checkpoint(ckpt.save, model, optimizer, scheduler, verify_hashes=ckpt.verify_hashes)
    if ckpt.load:
        state = load_checkpoint(
            ckpt.load, model, optimizer, scheduler, finetune=ckpt.finetune, verify_hashes=ckpt.verify_hashes
        )
        if state is None:
            raise FileNotFoundError(f"training.checkpoint.load={ckpt.load} holds no checkpoint")
        return state
    return None


def default_datasets(cfg: JobConfig) -> tuple[Sequence[dict], Sequence[dict] | None, str]:
    """(train, valid, tokenizer_dir) as the config's data section describes them (collective).

    cpt: megatron's blend of indexed datasets sized for train_iters (and the evaluations);
    sft: the curriculum of data.sft_phases (phases in order) and the data.sft_valid_fraction split.
    """
    t = cfg.training
    tokenizer_dir = cfg.tokenizer.path or str(default_tokenizer_dir())
    if cfg.data.mode == "sft":
        return *build_sft_splits(cfg), tokenizer_dir
    if cfg.data.mode != "cpt":
        raise ValueError(f"data.mode must be 'cpt' or 'sft', got {cfg.data.mode!r}")

    # Every evaluation reads the same first eval_iters global batches of the valid split.
    valid_samples = t.eval_iters * t.global_batch_size if t.eval_interval else 0
    train, valid = build_cpt_datasets(cfg, t.global_batch_size * t.train_iters, valid_samples)
    return train, valid, tokenizer_dir


def describe_run(cfg: JobConfig, train_dataset, dp_size: int, n_micro: int, start: int) -> str:
    """One log line: layout, batch shape, tokens per step, start iteration (and the CPT language share)."""
    t, p = cfg.training, cfg.parallel
    rows = getattr(train_dataset, "rows_per_sample", 1)
    line = (
        f"TP={p.tensor_model_parallel_size} PP={p.pipeline_model_parallel_size} DP={dp_size} | "
        f"global batch {t.global_batch_size} = micro {t.micro_batch_size} x DP {dp_size} x {n_micro} accumulation | "
        f"{t.global_batch_size * rows * t.seq_length:,} tokens/step | steps {start} -> {t.train_iters}"
    )
    if cfg.data.mode == "sft" and cfg.data.sft_packing and use_transformer_engine(cfg):
        line += "\npacked SFT on Transformer Engine: THD with cu_seqlens per conversation (data/packing.py)"
        if cfg.data.sft_attention_mask:  # TE takes no dense mask: building [s, s] per sample is waste
            line += "; set data.sft_attention_mask=false to skip the unused dense masks"
    if hasattr(train_dataset, "dataset_index") and cfg.data.paths:
        share = realised_language_share(train_dataset, cfg.data)
        line += "\nrealised language share (target): " + format_share(share, language_blend(cfg.data))
    return line
