"""The training loop: optimiser, schedule, accumulation, loaders, auxiliary losses (Primal-Attention's
KSVD objective) and the two evaluation protocols. The device, the seeds and the precision are the
run's environment (bench_cli/engine/env.py), chosen before the trainer is built.

The trainer knows no dataset and no metric by name: batches come from the task's loaders, the
loss from ``task.loss``, evaluations from ``task.evaluate`` and the direction of the selection
metric from ``task.selection_metric()`` (bench_cli.core.metrics). The same loop runs data-parallel over
several processes (``strategy: ddp``, bench_cli/engine/distributed.py) and in mixed precision
(``precision: bf16 | fp16``). The loss is the run's one objective (bench_cli/engine/objective.py).

``fit`` returns the evaluation history and what the protocol selected (``TrainResult``); it names
no record column: bench_cli/results/schema.py turns the result into the row, and resolves the protocols
(holdout: 'val' selects; paper: 'test' selects, flagged as optimistic).
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from bench_cli.engine import distributed
from bench_cli.core.metrics import accumulate, compute_all, host_values, Metric, selection_key
from bench_cli.results import schema
from bench_cli.results.loggers import StepLosses
from bench_cli.engine.checkpoint import Checkpoints, set_rng_state, rng_state
from bench_cli.core.phases import PHASES
from bench_cli.core.errors import DivergedError, UserError, hand_on, signals_deferred, unknown_choice
from bench_cli.engine.objective import Objective
from bench_cli.engine.optim import make_optimizer, make_scheduler, parameter_groups
from bench_cli.core.task import EvalContext, to_device
from bench_cli.engine.env import autocast, seed_worker
from bench_cli.engine.schedule import Schedule, plan_schedule
from bench_cli.engine.timing import RegionTimer


# trainer.train_metrics -> where the train_<metric> columns come from (train_metrics_source):
# none; batches = running means over the training batches since the last evaluation (dropout on,
# as keras' fit logs them), with the task's train_split_metrics (BLEU) evaluated on TRAIN with the
# reported weights; evaluation = every metric from an evaluation of TRAIN with the reported weights.
# true / false are batches / none (the setting was a switch before).
TRAIN_METRICS = {False: "", "none": "", True: "batches", "batches": "batches", "evaluation": "evaluation"}


def train_metrics_source(setting) -> str:
    if setting not in TRAIN_METRICS:
        raise unknown_choice("trainer.train_metrics", str(setting), ("none", "batches", "evaluation"))
    return TRAIN_METRICS[setting]


@dataclass
class TrainResult:
    """What a fit gave: the evaluation history (one row per evaluation), the selected evaluation
    (``best_epoch``, ``best_step``), the schedule planned and run, and the evaluations made with
    the reported weights (holdout: ``test`` of the selected weights and ``test_last`` of the last;
    ``splits``: other splits the task reports). bench_cli.results.schema names the columns."""

    metric: Metric
    protocol: schema.Protocol
    schedule: Schedule
    history: list = field(default_factory=list)
    best_epoch: int = 0
    best_step: int = 0  # optimiser steps at the selected evaluation
    epochs_run: int = 0
    steps_run: int = 0
    train_time_s: float = 0.0
    epoch_times_s: list = field(default_factory=list)  # training seconds of each epoch (schema: median, IQR)
    test: dict = field(default_factory=dict)
    test_last: dict = field(default_factory=dict)
    splits: dict = field(default_factory=dict)
    train_metrics_source: str = ""
    # the reported test evaluation's per-sample outputs, one dict of tensors per batch
    # (Task.sample_outputs; bench_cli/results/samples.py writes them); None: not kept
    samples: list | None = None

    @property
    def epochs_planned(self) -> int:
        return self.schedule.epochs

    @property
    def steps_planned(self) -> int:
        return self.schedule.total_steps

    @property
    def step_budget(self) -> int | None:
        return self.schedule.budget

    @property
    def by_steps(self) -> bool:
        return self.schedule.by_steps

    def selected_row(self) -> dict:
        return next(r for r in self.history if (r["epoch"], r["step"]) == (self.best_epoch, self.best_step))

    @property
    def metrics(self) -> dict:
        """The record's columns of this fit (bench_cli.results.schema)."""
        return schema.fit_columns(self)


def snapshot_weights(model: torch.nn.Module, into: dict | None = None) -> dict:
    """A copy of the model's weights on its own device: cloned the first time, then copied into the
    same buffers (``into``) each time the best evaluation improves, instead of a deep copy each time."""
    state = model.state_dict()
    if into is None or into.keys() != state.keys():
        return {k: v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in state.items()}
    for k, v in state.items():
        if torch.is_tensor(v) and into[k].shape == v.shape and into[k].dtype == v.dtype:
            into[k].copy_(v)
        else:  # extra (non-tensor) state, or a buffer that changed shape
            into[k] = v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v)
    return into


class Selection:
    """The best evaluation so far under the selection rule (the metric in its direction, ties to
    the lower loss: bench_cli.core.metrics.selection_key), a copy of its weights when they are needed
    later, and early stopping (``patience`` evaluations without improvement). ``keeps='last'``
    takes every evaluation instead (the protocol's rule, bench_cli.core.task.Protocol.keeps: keras'
    fit without a checkpoint keeps the last epoch's weights)."""

    def __init__(self, metric: Metric, tie: Metric | None, keep_weights: bool, patience, keeps: str = "best"):
        self.metric, self.tie, self.keep_weights, self.keeps = metric, tie, keep_weights, keeps
        self.patience = None if patience is None else int(patience)
        self.key, self.state, self.since_best = None, None, 0
        self.epoch = self.step = 0

    def offer(self, metrics: dict, model: torch.nn.Module, epoch: int, step: int) -> bool:
        """Consider one evaluation; True when patience has run out."""
        key = selection_key(self.metric, metrics, self.tie)
        if self.key is None or key > self.key or self.keeps == "last":
            self.key, self.epoch, self.step, self.since_best = key, epoch, step, 0
            self.state = snapshot_weights(model, self.state) if self.keep_weights else None
        else:
            self.since_best += 1
        return self.patience is not None and self.since_best >= self.patience

    @property
    def best_value(self) -> float:
        return self.metric.sort_key(self.key[0])  # sort_key is its own inverse

    def state_dict(self) -> dict:
        return {"key": None if self.key is None else list(self.key), "epoch": self.epoch, "step": self.step,
                "since_best": self.since_best, "weights": self.state}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        self.key = None if state["key"] is None else tuple(state["key"])
        self.epoch, self.step, self.since_best = state["epoch"], state["step"], state["since_best"]
        weights = state["weights"]
        self.state = None if weights is None else {k: v.to(device) if torch.is_tensor(v) else v for k, v in weights.items()}


class Trainer:
    def __init__(self, cfg, task, model: torch.nn.Module, device: torch.device, seed: int,
                 objective: Objective | None = None, logger=None, progress=None,
                 dist: distributed.DistEnv = distributed.SINGLE, checkpoints: Checkpoints | None = None,
                 keep_samples: bool = False, on_evaluation=None):
        self.cfg, self.task, self.device, self.seed = cfg, task, device, seed
        # each test evaluation's per-sample outputs (the reported one's go to the result); one
        # process's shard is not the test set, so a distributed fit keeps none
        self.keep_samples, self.test_samples = keep_samples and not dist.active, None
        self.on_evaluation = on_evaluation  # called with each evaluation's history row (an Optuna trial's pruner)
        self.checkpoints = checkpoints  # the job's checkpoints (bench_cli.engine.checkpoint); None: not saved
        self.model, self.logger, self.progress = model, logger, progress
        self.objective = objective or Objective(task)  # the task loss (+ eta x the KSVD term)
        self.dist, self.precision = dist, str(cfg.get("precision", "32"))
        self.train_model = model  # what the training step calls: the model, or its DDP wrapper
        if dist.active:
            from torch.nn.parallel import DistributedDataParallel

            self.train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def autocast(self):
        return autocast(self.device, self.precision)

    def batch_size(self, train: bool) -> int:
        """Samples per loader batch of this process: ``batch_size`` is the global batch, split over
        the processes of a distributed run (bench_cli.engine.distributed)."""
        bs = int(self.cfg.batch_size if train else self.cfg.eval_batch_size)
        if self.dist.world_size > 1:
            if train and bs % self.dist.world_size:
                raise UserError(f"trainer.batch_size={bs} is not divisible by the {self.dist.world_size} processes")
            bs = max(1, bs // self.dist.world_size)
        return bs

    def loader(self, split: str, train: bool) -> DataLoader:
        # Every process of a distributed run gets its own augmentation stream (rank 0's is the
        # single-process one).
        g = torch.Generator().manual_seed(self.seed + self.dist.rank)
        bs = self.batch_size(train)
        if train and self.cfg.get("micro_batch_size"):  # the batch is accumulated from micro-batches
            bs = min(bs, int(self.cfg.micro_batch_size))
        # Every loader gets its own generator: an iterator without one draws its base seed from the
        # global stream, so evaluating (how often, on which split) would change the dropout of the
        # training that follows. Workers seed numpy/random from their torch seed (base seed from
        # ``g`` + worker id), so augmentation is the same for a seed whatever the worker count.
        dataset = self.task.dataset(split)
        sampler = self.task.sampler(split, dataset, g)
        drop_last = train and bool(self.cfg.get("drop_last", False))
        if sampler is None and self.dist.active:  # shard the split over the processes
            from torch.utils.data.distributed import DistributedSampler

            sampler = (DistributedSampler(dataset, self.dist.world_size, self.dist.rank, shuffle=True, seed=self.seed,
                                          drop_last=drop_last) if train
                       else distributed.ShardSampler(len(dataset), self.dist.rank, self.dist.world_size))
        workers = int(self.cfg.get("num_workers") or 0)
        return DataLoader(dataset, batch_size=bs, shuffle=train and sampler is None, sampler=sampler, generator=g,
                          collate_fn=self.task.collate(split), num_workers=workers, drop_last=drop_last,
                          worker_init_fn=seed_worker if workers else None, persistent_workers=False,
                          pin_memory=self.device.type == "cuda")

    def evaluate(self, split: str, metrics: list[str] | None = None) -> dict:
        """The task's evaluation of ``split`` (a progress bar per batch on a terminal); in a
        distributed run each process evaluates its shard and the statistics are summed.
        ``metrics``: the names wanted (None: all)."""
        bar = None
        if self.progress:
            bar = self.progress.add_task(f"eval {split}", total=None, transient=True)
        kept = [] if self.keep_samples and split == "test" else None
        ctx = EvalContext(loader=lambda s: self.loader(s, train=False), device=self.device,
                          advance=(lambda: self.progress.advance(bar)) if bar is not None else (lambda: None),
                          reduce=distributed.all_reduce_sums, metrics=metrics,
                          keep=(lambda out: kept.append({k: v.detach() for k, v in out.items()})) if kept is not None else None)
        if kept is not None:
            self.test_samples = kept
        distributed.broadcast_buffers(self.model)  # one model evaluated on every shard (a no-op on one process)
        try:
            with self.autocast():
                return self.task.evaluate(self.model, split, ctx)
        finally:
            if bar is not None:
                self.progress.remove_task(bar)

    def forward_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, model output) of a training batch: the objective on the model's output."""
        with self.autocast():
            out = self.train_model(**self.task.model_inputs(batch))
            return self.objective(self.model, out, batch), out

    def training_loss(self, batch: dict) -> torch.Tensor:
        return self.forward_loss(batch)[0]

    def schedule(self, train_loader: DataLoader) -> Schedule:
        accum = max(1, int(self.cfg.get("accumulate_grad_batches", 1)))
        if self.cfg.get("micro_batch_size"):  # keep the effective batch_size on a small machine
            accum *= math.ceil(self.batch_size(True) / train_loader.batch_size)
        return plan_schedule(self.cfg, len(train_loader), accum)

    def optimisation(self, plan: Schedule):
        """(optimiser, lr scheduler or None, grad scaler) of the trainer config. The lr of
        ``optimizer.lr_reference_batch`` is scaled linearly to the (global) batch_size (DeiT:
        5e-4 x batch / 512)."""
        cfg = self.cfg
        reference = cfg.optimizer.get("lr_reference_batch")
        lr_scale = int(cfg.batch_size) / float(reference) if reference else 1.0
        params = parameter_groups(self.model, float(cfg.optimizer.get("weight_decay", 0.0)),
                                  bool(cfg.optimizer.get("no_decay_1d", False)))
        opt = make_optimizer(params, cfg.optimizer, lr_scale)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        return opt, make_scheduler(opt, cfg.scheduler, plan.total_steps, plan.steps_per_epoch), scaler

    def fit(self, protocol: str) -> TrainResult:
        """Train on the schedule (``Schedule``), evaluating the protocol's selection split after the
        first, every ``eval_every_epochs``-th and the last epoch or every ``eval_every_steps``
        optimiser steps (the LRA code's ``eval_frequency``); then evaluate what the protocol
        reports with the selected weights. With ``checkpoints``, the fit is saved as they say and
        continues from the job's newest checkpoint, to the result an uninterrupted fit gives; a
        termination signal (bench_cli.core.errors.catch_termination) stops it at the next step
        boundary, after a checkpoint."""
        proto = self.task.resolve_protocol(protocol)  # the paper protocol's rule is the task config's
        train_loader = self.loader("train", train=True)
        plan = self.schedule(train_loader)
        opt, sched, scaler = self.optimisation(plan)
        source = train_metrics_source(self.cfg.get("train_metrics", False))
        # TRAIN evaluated at the end with the reported weights: every metric, or what batches cannot give
        train_eval = (None if source == "evaluation" else list(self.task.train_split_metrics) if source else [])
        result = TrainResult(self.task.selection_metric(), proto, plan, train_metrics_source=source)
        selection = Selection(result.metric, self.task.loss_metric(), proto.holds_out or train_eval != [],
                              self.cfg.early_stopping.get("patience"), keeps=proto.keeps)
        loop = _Loop(self, plan, opt, sched, scaler, result, selection, train_loader)
        with PHASES("resume"):  # reading and restoring a checkpoint (bench-overhead shows its cost)
            resume = self.checkpoints.load() if self.checkpoints is not None else None
            if resume is not None:
                loop.restore(resume)
        with signals_deferred():
            loop.run(resume["position"] if resume is not None else None)
        result.best_epoch, result.best_step = selection.epoch, selection.step
        self.evaluate_reported(result, selection, train_eval)
        return result

    def evaluate_reported(self, result: TrainResult, selection: Selection, train_eval: list[str] | None) -> None:
        """Holdout: TEST of the last and of the selected weights (once when they are the same:
        rollouts are costly). Then TRAIN with the selected weights, for ``train_eval`` (the metric
        names; None: all of them; []: not evaluated)."""
        if result.protocol.holds_out:
            result.test_last = self.evaluate("test")
            final = result.history[-1]
            if (final["epoch"], final["step"]) == (selection.epoch, selection.step) and final["step"] == result.steps_run:
                result.test = result.test_last
            else:
                self.model.load_state_dict(selection.state)
                result.test = self.evaluate("test")
            result.samples = self.test_samples  # of the evaluation just reported
        if train_eval != []:
            self.model.load_state_dict(selection.state)  # the weights whose test metrics are reported
            result.splits["train"] = self.evaluate("train", train_eval)


class _Loop:
    """One fit's training loop and its running state (steps, the training losses and training-batch
    statistics since the last evaluation), evaluating and selecting as the schedule says.

    Nothing in the step loop reads a tensor on the host: on CUDA a ``.item()`` per step is a
    host-device sync per step. The losses stay on the device and are read once per evaluation,
    where their finiteness is checked (``read_losses``); a live tracker (wandb, tensorboard) reads
    its step losses every ``logger.log_every_n_steps`` steps (bench_cli.results.loggers.StepLosses)."""

    def __init__(self, trainer: Trainer, plan: Schedule, opt, sched, scaler, result: TrainResult, selection: Selection,
                 train_loader: DataLoader):
        self.trainer, self.plan, self.opt, self.sched, self.scaler = trainer, plan, opt, sched, scaler
        self.result, self.selection, self.train_loader = result, selection, train_loader
        self.checkpoints = trainer.checkpoints
        self.checkpoint_every = self.checkpoints.settings.every if self.checkpoints is not None else 0
        # when a termination signal stops the fit (on every process together)
        self.stop = distributed.StopVote(trainer.dist)
        self.clock = RegionTimer(trainer.device)  # training time not yet added to the result (CUDA events on a GPU)
        self.epoch_start_generator: torch.Tensor | None = None  # the loader generator's state at the epoch's start
        self.train_metrics = result.train_metrics_source == "batches"
        self.step, self.train_stats = 0, {}
        self.losses: list[torch.Tensor] = []  # each training batch's loss since the last evaluation (on the device)
        self.loss_at: list[tuple[int, int]] = []  # (epoch, batch) of each, to say where a loss diverged
        self.step_losses = StepLosses(trainer.logger)  # the loss every logger.log_every_n_steps steps
        clip = trainer.cfg.get("grad_clip")  # read once: a config lookup per step costs more than the clip
        self.grad_clip = float(clip) if clip else None
        # the bar counts optimiser steps (an epoch of ImageNet moves it too); an epoch schedule names the epoch
        progress = trainer.progress
        self.bar = progress.add_task("train", total=plan.total_steps, status="", unit="steps") if progress else None

    def run(self, position: dict | None = None) -> None:
        """The epochs of the schedule, from the first or from a checkpoint's ``position``."""
        trainer, plan, train_loader = self.trainer, self.plan, self.train_loader
        first = 1 if position is None else plan.epochs + 1 if position["finished"] else position["epoch"]
        if position is not None and position["finished"]:
            set_rng_state(position["rng"])
        for epoch in range(first, plan.epochs + 1):
            trainer.train_model.train()
            if hasattr(train_loader.sampler, "set_epoch"):  # distributed / repeated-augmentation samplers
                train_loader.sampler.set_epoch(epoch - 1)
            if self.bar is not None and not plan.by_steps:
                trainer.progress.update(self.bar, description=f"epoch {epoch}/{plan.epochs}")
            try:
                stop = self.epoch(train_loader, epoch, position if epoch == first else None)
            except Exception:  # a model may fail on the weights a non-finite loss left: that is the cause
                self.raise_if_diverged(distributed.SINGLE)
                raise
            self.result.epochs_run = epoch
            if plan.evaluates_after(epoch):
                stop = self.evaluate_and_select(epoch)
            if stop or self.step >= plan.total_steps:
                break
            due = not plan.by_steps and (plan.evaluates_after(epoch) if not self.checkpoint_every
                                         else epoch % self.checkpoint_every == 0)
            self.boundary(due, epoch + 1, 0)
        if self.losses:  # steps after the last evaluation (none on the schedules above): still checked
            self.read_losses()
        self.step_losses.read()
        self.result.steps_run = self.step
        if position is None or not position["finished"]:
            keep_final = self.checkpoints is not None and self.checkpoints.settings.keep_final
            self.boundary(keep_final, self.result.epochs_run, 0, finished=True)

    def boundary(self, due: bool, epoch: int, batches: int, finished: bool = False) -> None:
        """A point where the fit can be saved and resumed: ``epoch`` is the epoch to continue with,
        after ``batches`` of its loader batches (``finished``: training is over). A checkpoint when
        ``due`` or when a termination signal came (to any process of a distributed run: they all
        stop here); then the signal stops the run."""
        signum = self.stop.at_boundary()
        if self.checkpoints is not None and (due or signum):
            with PHASES("checkpoint"):
                self.checkpoints.save(self.state(epoch, batches, finished))
        if signum:
            hand_on(signum)

    def state(self, epoch: int, batches: int, finished: bool) -> dict:
        """What the rest of the fit depends on (bench_cli.engine.checkpoint), at a boundary."""
        generator = self.train_loader.generator
        position = {"epoch": epoch, "batches": batches, "step": self.step, "finished": finished, "rng": rng_state(),
                    "epoch_start_generator": self.epoch_start_generator if batches else generator.get_state()}
        return {"position": position, "model": self.trainer.model.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict() if self.sched is not None else None,
                "scaler": self.scaler.state_dict(), "selection": self.selection.state_dict(),
                "objective": self.trainer.objective.state_dict(),
                "result": {"history": self.result.history, "epochs_run": self.result.epochs_run,
                           "train_time_s": self.result.train_time_s, "epoch_times_s": list(self.result.epoch_times_s)},
                "pending": {"losses": list(self.losses), "loss_at": [list(a) for a in self.loss_at],
                            "train_stats": dict(self.train_stats), "step_losses": self.step_losses.state_dict()}}

    def restore(self, state: dict) -> None:
        """The fit as ``state`` left it (the random states and the loader's position are restored
        where the loop reaches the position: ``epoch``). A checkpoint that does not fit this model
        or optimiser is one line."""
        trainer, device = self.trainer, self.trainer.device
        try:
            trainer.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            if self.sched is not None:
                self.sched.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            trainer.objective.load_state_dict(state["objective"])
            self.selection.load_state_dict(state["selection"], device)
            result = state["result"]
            self.result.history = list(result["history"])
            self.result.epochs_run, self.result.train_time_s = result["epochs_run"], result["train_time_s"]
            self.result.epoch_times_s = list(result.get("epoch_times_s", []))
            pending = state["pending"]
            self.losses = [loss.to(device) for loss in pending["losses"]]
            self.loss_at = [tuple(a) for a in pending["loss_at"]]
            self.train_stats = {k: v.to(device) if torch.is_tensor(v) else v for k, v in pending["train_stats"].items()}
            self.step = state["position"]["step"]
            self.step_losses.load_state_dict(pending.get("step_losses"), device, self.result.history)
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as e:
            reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(f"checkpoint {trainer.checkpoints.resumed_from} does not fit this run ({reason}): "
                            "remove it, or run with trainer.resume=false") from None
        if self.bar is not None:
            trainer.progress.update(self.bar, completed=self.step)

    def read_losses(self) -> tuple[float, int]:
        """Sum and number of the training losses since the last evaluation, over every process,
        read from the device at once and summed in order as Python floats (the same train_loss as a
        ``.item()`` per step gave). DivergedError at the first non-finite loss, on every process
        together. The pending losses are cleared."""
        values = torch.stack(self.losses).tolist() if self.losses else []
        local = 0.0
        for value in values:  # in order, not sum(): Python >= 3.12's sum() compensates
            local += value
        diverged = not all(math.isfinite(v) for v in values)
        sums = distributed.all_reduce_sums({"loss": local, "batches": float(len(values)), "diverged": float(diverged)},
                                 same_keys=True)
        if sums["diverged"]:
            self.raise_if_diverged(self.trainer.dist, values)
        self.losses, self.loss_at = [], []
        return sums["loss"], int(sums["batches"])

    def raise_if_diverged(self, dist: distributed.DistEnv, values: list[float] | None = None) -> None:
        """DivergedError naming the first non-finite training loss since the last evaluation (its
        epoch and batch); in a distributed run, another process's when this one's are finite."""
        if values is None:
            values = torch.stack(self.losses).tolist() if self.losses else []
        for value, (epoch, i) in zip(values, self.loss_at):
            if not math.isfinite(value):
                raise DivergedError(f"loss is {value} at epoch {epoch}, batch {i}")
        if dist.active:
            epoch = self.loss_at[-1][0] if self.loss_at else self.result.epochs_run
            raise DivergedError(f"loss is not finite on another process (by epoch {epoch})")

    def epoch(self, train_loader, epoch: int, position: dict | None = None) -> bool:
        """One pass over the training loader (or until the step budget); True when early stopping
        says stop at an evaluation inside the epoch (``eval_every_steps``). ``position``: a
        checkpoint's, inside this epoch: its batches are drawn again (the same, from the loader
        generator's state at the epoch's start) and skipped, then the random states are restored."""
        trainer, plan, result = self.trainer, self.plan, self.result
        stop, before = False, result.train_time_s
        self.opt.zero_grad(set_to_none=True)
        n_batches = len(train_loader)
        generator = train_loader.generator
        if position is not None:
            generator.set_state(position["epoch_start_generator"])
        self.epoch_start_generator = generator.get_state()
        batches, skip = iter(train_loader), position["batches"] if position is not None else 0
        for _ in range(skip):
            next(batches)
        if position is not None:  # the skipped batches drew from the loader's generator as the first time
            set_rng_state(position["rng"])
        self.clock.start()
        try:
            for i, batch in enumerate(batches, start=skip):
                last_micro = (i + 1) % plan.accum == 0 or i + 1 == n_batches
                self.backward(to_device(batch, trainer.device), last_micro, epoch, i)
                if last_micro:
                    self.optimiser_step()
                    self.step_losses.stepped(self.step, epoch)
                    evaluates = plan.evaluates_at_step(self.step)
                    if evaluates:
                        result.train_time_s += self.clock.stop()
                        stop = self.evaluate_and_select(epoch)
                        trainer.train_model.train()
                        self.clock.start()
                    if stop or self.step >= plan.total_steps:
                        break
                    due = plan.by_steps and (evaluates if not self.checkpoint_every else self.step % self.checkpoint_every == 0)
                    signalled = self.stop.after_step()  # every step, on every process (a vote in a distributed run)
                    if due or signalled:  # the clock paused only then: on CUDA a stop waits for the device
                        result.train_time_s += self.clock.stop()  # a checkpoint is not training time
                        self.boundary(due, epoch, i + 1)
                        self.clock.start()
        finally:
            # The loader's worker processes stop here, also when a signal or an error ends the epoch:
            # left to the traceback that keeps this frame, the iterator was freed by a later garbage
            # collection, whose shutdown of its workers then waited 5 s for each (torch's
            # MP_STATUS_CHECK_INTERVAL) in whatever ran next in the process.
            del batches
        result.train_time_s += self.clock.stop()
        result.epoch_times_s.append(result.train_time_s - before)
        return stop

    def backward(self, batch: dict, last_micro: bool, epoch: int, i: int) -> None:
        trainer = self.trainer
        # DDP averages the gradients on the last micro-batch of a step only
        sync = contextlib.nullcontext() if last_micro or not trainer.dist.active else trainer.train_model.no_sync()
        with sync:
            loss, out = trainer.forward_loss(batch)
            self.scaler.scale(loss / self.plan.accum).backward()
        # kept on the device; read and checked for divergence at the next evaluation (read_losses)
        self.losses.append(loss.detach())
        self.loss_at.append((epoch, i))
        self.step_losses.add(self.losses[-1])
        if self.train_metrics:
            with torch.no_grad():
                accumulate(self.train_stats, trainer.task.batch_stats(out.detach().float(), batch))

    def optimiser_step(self) -> None:
        trainer, opt = self.trainer, self.opt
        if self.grad_clip:
            self.scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), self.grad_clip)
        self.scaler.step(opt)
        self.scaler.update()
        opt.zero_grad(set_to_none=True)
        self.step += 1
        if self.sched is not None and self.step < self.plan.total_steps:  # the lr after the last step is never used
            self.sched.step()
        if self.bar is not None:  # the count only: its status (a metric) changes at evaluations, no tensor is read here
            trainer.progress.count(self.bar, self.step)

    def evaluate_and_select(self, epoch: int) -> bool:
        """One evaluation (a history row); True when early stopping says stop."""
        trainer, result, selection = self.trainer, self.result, self.selection
        split = result.protocol.selects
        self.step_losses.read()  # the step losses up to here, before the evaluation row (and a divergence)
        loss_sum, batches = self.read_losses()
        row = {"epoch": epoch, "step": self.step, "train_loss": loss_sum / max(batches, 1),
               "lr": self.opt.param_groups[0]["lr"]}
        if self.train_metrics:  # the task's metrics over the training batches since the last evaluation
            # (dropout and augmentation on, as keras reports them); its loss metric is train_loss.
            # the statistics were summed on the device (metrics.accumulate): read here, once per evaluation
            stats = distributed.all_reduce_sums(host_values(self.train_stats))
            row.update({f"train_{k}": v for k, v in compute_all(trainer.task.metrics, stats).items()})
        self.train_stats = {}
        selected = trainer.evaluate(split)
        row.update({f"{split}_{k}": v for k, v in selected.items()})
        stop = selection.offer(selected, trainer.model, epoch, self.step)
        if split == "test" and (selection.epoch, selection.step) == (epoch, self.step):
            result.samples = trainer.test_samples  # the paper protocol reports this evaluation (so far)
        result.history.append(row)
        if trainer.on_evaluation is not None:  # may stop the fit (bench_cli/engine/pruning.py: PrunedError)
            trainer.on_evaluation(row)
        at = f"step {selection.step}" if self.plan.by_steps else f"epoch {selection.epoch}"  # the schedule's unit
        if trainer.logger is not None:  # with the selection so far, so every line agrees with the record
            trainer.logger.log_epoch({**row, "best_epoch": selection.epoch, "best_step": selection.step, "best_at": at,
                                f"best_{split}_{result.metric.name}": selection.best_value})
        if self.bar is not None:
            status = f"{split} {result.metric.name} {selected[result.metric.name]:.2f}  "
            trainer.progress.update(self.bar, status=status + f"best {selection.best_value:.2f} @ {at}")
        return stop
