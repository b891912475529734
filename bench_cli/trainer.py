"""The training loop: optimiser, schedule, accumulation, device, seeds, loaders, auxiliary losses
(Primal-Attention's KSVD objective) and the two evaluation protocols.

The trainer knows no dataset and no metric by name: batches come from the task's loaders, the
loss from ``task.loss``, evaluations from ``task.evaluate`` and the direction of the selection
metric from ``task.selection_metric()`` (bench_cli.metrics). The same loop runs data-parallel over
several processes (``strategy: ddp``, bench_cli/distributed.py) and in mixed precision
(``precision: bf16 | fp16``).

Protocols (recorded in every result):
- ``holdout``: a validation split carved from TRAIN selects the evaluation (the best value of the
  selection metric, ties to the lower loss); the test metrics of those weights are reported.
- ``paper``: the papers' practice, the best test value over the evaluations (highest accuracy,
  lowest RMSE...). Optimistic: the test set selects the model. Reported under this name only.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader

from bench_cli import distributed as D
from bench_cli import metrics as M
from bench_cli.errors import UserError, unknown_choice
from models.attention import collect_auxiliary_loss
from tasks.base import EvalContext


class DivergedError(RuntimeError):
    """The loss became NaN or infinite."""


def select_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"trainer.device={name} but CUDA is not available here; use trainer.device=auto or cpu")
    return torch.device(name)


def seed_everything(seed: int, deterministic: bool = True) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


OPTIMIZERS = ("adam", "adamw", "radam", "rmsprop", "sgd")
SCHEDULERS = ("none", "linear_warmup", "cosine", "step", "onecycle", "inverse_sqrt")


def parameter_groups(model: torch.nn.Module, weight_decay: float, no_decay_1d: bool = False):
    """The trainable parameters; with ``no_decay_1d`` (``optimizer.no_decay_1d``), timm's
    ``param_groups_weight_decay`` as DeiT uses it: 1-D parameters (norms, biases) and the names the
    model lists in ``no_weight_decay()`` (e.g. position embedding, cls token) get weight decay 0."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not no_decay_1d or not weight_decay:
        return [p for _, p in named]
    hook = getattr(model, "no_weight_decay", None)
    skip = set(hook()) if callable(hook) else set()
    plain = [p for n, p in named if p.ndim <= 1 or n.endswith(".bias") or n in skip]
    decayed = [p for n, p in named if not (p.ndim <= 1 or n.endswith(".bias") or n in skip)]
    return [{"params": plain, "weight_decay": 0.0}, {"params": decayed, "weight_decay": weight_decay}]


def make_optimizer(params, cfg, lr_scale: float = 1.0) -> torch.optim.Optimizer:
    name, lr, wd = cfg.name, float(cfg.lr) * lr_scale, float(cfg.get("weight_decay", 0.0))
    betas = tuple(cfg.get("betas", (0.9, 0.999)))
    eps = float(cfg.get("eps", 1e-8) or 1e-8)  # the LRA PyTorch code uses AdamW eps 1e-6
    makers = {
        "adam": lambda: torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "radam": lambda: torch.optim.RAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=float(cfg.get("momentum", 0.9)), weight_decay=wd),
        # keras' RMSprop (the keras-io translation example): rho 0.9, epsilon 1e-7, no momentum
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=lr, alpha=float(cfg.get("rho", 0.9)), eps=eps,
                                               weight_decay=wd, momentum=float(cfg.get("momentum", 0.0) or 0.0)),
    }
    if name not in makers:
        raise unknown_choice("optimizer", name, makers)
    return makers[name]()


def make_scheduler(opt, cfg, total_steps: int, steps_per_epoch: int):
    name, warm = cfg.name, int(cfg.get("warmup_steps", 0) or 0)
    warm = warm or int(cfg.get("warmup_epochs") or 0) * steps_per_epoch
    base_lr = opt.param_groups[0]["lr"]
    # Absolute start (warmup_lr) and floor (min_lr) of timm's CosineLRScheduler (DeiT: 1e-6, 1e-5);
    # left unset, the warm-up starts at lr / warmup_steps and the cosine decays to 0.
    start = float(cfg.get("warmup_lr")) / base_lr if cfg.get("warmup_lr") is not None else None
    floor = float(cfg.get("min_lr") or 0.0) / base_lr

    def warmup(step):
        if not warm:
            return 1.0
        if start is not None:  # timm: warmup_lr + step * (lr - warmup_lr) / warmup_t
            return start + (1.0 - start) * min(1.0, step / warm)
        return min(1.0, (step + 1) / warm)

    if name == "none":
        return None
    if name == "linear_warmup":
        return torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    if name == "cosine":
        def cosine(step):
            if step < warm:
                return warmup(step)
            progress = (step - warm) / max(1, total_steps - warm)
            return floor + (1.0 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return torch.optim.lr_scheduler.LambdaLR(opt, cosine)
    if name == "step":
        every = int(cfg.step_size) * steps_per_epoch
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup(s) * cfg.gamma ** (s // max(every, 1)))
    if name == "onecycle":  # torch OneCycleLR as the LRA PyTorch code (Nystromformer/Transformer-LS) uses it
        total = max(total_steps, 1)  # pct_start = warmup / total
        w = max(0, min(warm, total - 1))  # short runs: both phases need steps, and torch divides by w - 1
        if w == 1:
            w = 2 if total > 2 else 0
        return torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=total,
            pct_start=float(w) / total, anneal_strategy=str(cfg.get("anneal", "linear")),
            cycle_momentum=bool(cfg.get("cycle_momentum", True)))
    if name == "inverse_sqrt":  # fairseq's inverse_square_root_schedule (Vaswani et al. 2017, Sec. 5.3)
        # lr(n) after n updates: linear from warmup_init_lr to lr over the warm-up, then lr * sqrt(warm / n).
        def inverse_sqrt(step):
            if step < warm:
                start = float(cfg.get("warmup_init_lr") or 0.0) / float(opt.defaults["lr"])
                return start + step * (1.0 - start) / warm
            return math.sqrt(max(warm, 1) / max(step, 1))
        return torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt)
    raise unknown_choice("scheduler", name, SCHEDULERS)


def seed_worker(worker_id: int) -> None:
    """DataLoader worker init: numpy and random follow the worker's torch seed."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@dataclass
class TrainResult:
    metrics: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    best_epoch: int = 0
    epochs_run: int = 0
    best_step: int = 0  # optimiser steps at the selected evaluation
    steps_run: int = 0
    train_time_s: float = 0.0


PRECISIONS = ("32", "bf16", "fp16")


def autocast(device: torch.device, precision: str):
    """Mixed precision of ``trainer.precision``: bf16/fp16 autocast (fp16 with a GradScaler, see
    ``Trainer``); ``32`` does nothing. fp16 needs CUDA (bench_cli.validate refuses it on the CPU)."""
    if str(precision) == "32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if str(precision) == "bf16" else torch.float16)


class Trainer:
    def __init__(self, cfg, task, model: torch.nn.Module, device: torch.device, seed: int,
                 eta: float = 0.0, logger=None, progress=None, dist: D.DistEnv = D.SINGLE,
                 auxiliary_layers: str = "sum"):
        self.cfg, self.task, self.device, self.seed = cfg, task, device, seed
        self.model, self.eta, self.logger, self.progress = model, float(eta or 0.0), logger, progress
        self.auxiliary_layers = auxiliary_layers  # model.ksvd_layers: sum | mean over the Primal layers
        self.dist, self.precision = dist, str(cfg.get("precision", "32"))
        self.train_model = model  # what the training step calls: the model, or its DDP wrapper
        if dist.active:
            from torch.nn.parallel import DistributedDataParallel

            self.train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def autocast(self):
        return autocast(self.device, self.precision)

    def batch_size(self, train: bool) -> int:
        """Samples per loader batch of this process: ``batch_size`` is the global batch, split over
        the processes of a distributed run (bench_cli.distributed)."""
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
                       else D.ShardSampler(len(dataset), self.dist.rank, self.dist.world_size))
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
        ctx = EvalContext(loader=lambda s: self.loader(s, train=False), device=self.device,
                          advance=(lambda: self.progress.advance(bar)) if bar is not None else (lambda: None),
                          reduce=D.all_reduce_sums, metrics=metrics)
        try:
            with self.autocast():
                return self.task.evaluate(self.model, split, ctx)
        finally:
            if bar is not None:
                self.progress.remove_task(bar)

    def forward_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, model output) of a training batch: the task's loss plus eta x the auxiliary loss."""
        with self.autocast():
            out = self.train_model(**self.task.model_inputs(batch))
            loss = self.task.loss(out, batch)
            if self.eta:
                j = collect_auxiliary_loss(self.model, self.auxiliary_layers)
                if j is not None:
                    loss = loss + self.eta * j
        return loss, out

    def training_loss(self, batch: dict) -> torch.Tensor:
        return self.forward_loss(batch)[0]

    def fit(self, protocol: str) -> TrainResult:
        """Train, evaluating on the selection split after the first, every ``eval_every_epochs``-th
        and the last epoch or, with ``eval_every_steps``, every that many optimiser steps (the LRA
        code's ``eval_frequency``).
        ``max_steps`` (optimiser steps; the train loader is cycled) replaces ``max_epochs``.
        ``step_budget`` caps either: at most ceil(budget / steps per epoch) whole epochs, or
        min(max_steps, budget) steps, so a reduced budget cuts big datasets and spares small ones."""
        cfg, model = self.cfg, self.model
        metric, tie = self.task.selection_metric(), self.task.loss_metric()
        select_split = {"holdout": "val", "paper": "test"}[protocol]
        train_loader = self.loader("train", train=True)
        accum = max(1, int(cfg.get("accumulate_grad_batches", 1)))
        if cfg.get("micro_batch_size"):  # keep the effective batch_size on a small machine
            accum *= math.ceil(self.batch_size(True) / train_loader.batch_size)
        steps_per_epoch = math.ceil(len(train_loader) / accum)
        max_steps = int(cfg.get("max_steps") or 0) or None
        eval_every = int(cfg.get("eval_every_steps") or 0) or None
        eval_every_epochs = max(1, int(cfg.get("eval_every_epochs") or 1))
        # A reduced (CPU) budget in optimiser steps: small datasets keep their whole schedule.
        budget = int(cfg.get("step_budget") or 0)
        if budget and max_steps:
            max_steps = min(max_steps, budget)
        epochs = math.ceil(max_steps / steps_per_epoch) if max_steps else int(cfg.max_epochs)
        if budget and not max_steps:
            epochs = min(epochs, math.ceil(budget / steps_per_epoch))
        total_steps = max_steps or epochs * steps_per_epoch
        # optimizer.lr_reference_batch: the lr is given for that batch and scaled linearly to the
        # (global) batch_size (DeiT: 5e-4 x batch / 512).
        reference = cfg.optimizer.get("lr_reference_batch")
        lr_scale = int(cfg.batch_size) / float(reference) if reference else 1.0
        params = parameter_groups(model, float(cfg.optimizer.get("weight_decay", 0.0)),
                                  bool(cfg.optimizer.get("no_decay_1d", False)))
        opt = make_optimizer(params, cfg.optimizer, lr_scale)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        train_metrics, train_stats = bool(cfg.get("train_metrics", False)), {}
        sched = make_scheduler(opt, cfg.scheduler, total_steps, steps_per_epoch)
        clip = cfg.get("grad_clip")
        patience = cfg.early_stopping.get("patience")
        result, best_key, best_state, since_best = TrainResult(), None, None, 0
        report_splits = tuple(self.task.report_splits())  # evaluated at the end with the reported weights
        keep_best = protocol == "holdout" or bool(report_splits)
        bar_total, bar_unit = (total_steps, "steps") if (max_steps or eval_every) else (epochs, "epochs")
        bar = self.progress.add_task("train", total=bar_total, status="") if self.progress else None
        step, loss_sum, n_batches, stop = 0, 0.0, 0, False

        def evaluate_and_select(epoch: int) -> bool:
            """One evaluation (a history row); True when early stopping says stop."""
            nonlocal best_key, best_state, since_best, loss_sum, n_batches, train_stats
            sums = D.all_reduce_sums({"loss": loss_sum, "batches": float(n_batches)}, same_keys=True)
            row = {"epoch": epoch, "step": step, "train_loss": sums["loss"] / max(sums["batches"], 1),
                   "lr": opt.param_groups[0]["lr"]}
            if train_metrics:  # the task's metrics over the training batches since the last evaluation
                # (dropout and augmentation on, as keras reports them); its loss metric is train_loss
                row.update({f"train_{k}": v for k, v in M.compute_all(self.task.metrics, D.all_reduce_sums(train_stats)).items()})
            loss_sum, n_batches, train_stats = 0.0, 0, {}
            selected = self.evaluate(select_split)
            row.update({f"{select_split}_{k}": v for k, v in selected.items()})
            key = M.selection_key(metric, selected, tie)
            if best_key is None or key > best_key:
                best_key, result.best_epoch, result.best_step, since_best = key, epoch, step, 0
                best_state = copy.deepcopy(model.state_dict()) if keep_best else None
            else:
                since_best += 1
            result.history.append(row)
            if self.logger is not None:
                self.logger.log_epoch(row)
            if bar is not None:
                at = f"step {result.best_step}" if bar_unit == "steps" else result.best_epoch
                best = metric.sort_key(best_key[0])  # sort_key is its own inverse
                self.progress.update(bar, status=f"{select_split} {metric.name} {selected[metric.name]:.2f}  "
                                     f"best {best:.2f} @ {at}")
            return patience is not None and since_best >= int(patience)

        for epoch in range(1, epochs + 1):
            self.train_model.train()
            if hasattr(train_loader.sampler, "set_epoch"):  # distributed / repeated-augmentation samplers
                train_loader.sampler.set_epoch(epoch - 1)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            for i, batch in enumerate(train_loader):
                batch = to_device(batch, self.device)
                last_micro = (i + 1) % accum == 0 or i + 1 == len(train_loader)
                # DDP averages the gradients on the last micro-batch of a step only
                sync = contextlib.nullcontext() if last_micro or not self.dist.active else self.train_model.no_sync()
                with sync:
                    loss, out = self.forward_loss(batch)
                    value = local = loss.item()
                    if self.dist.active:  # every process stops together when one diverges
                        value = D.all_reduce_sums({"loss": local}, same_keys=True)["loss"]
                    if not math.isfinite(value):
                        raise DivergedError(f"loss is {value} at epoch {epoch}, batch {i}")
                    scaler.scale(loss / accum).backward()
                loss_sum, n_batches = loss_sum + local, n_batches + 1
                if train_metrics:
                    with torch.no_grad():
                        M.accumulate(train_stats, self.task.batch_stats(out.detach().float(), batch))
                if last_micro:
                    if clip:
                        scaler.unscale_(opt)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                    step += 1
                    if sched is not None and step < total_steps:  # the lr after the last step is never used
                        sched.step()
                    if bar is not None and bar_unit == "steps":
                        self.progress.update(bar, advance=1)
                    if eval_every and (step % eval_every == 0 or step == total_steps):
                        result.train_time_s += time.perf_counter() - t0
                        stop = evaluate_and_select(epoch)
                        self.train_model.train()
                        t0 = time.perf_counter()
                    if stop or step >= total_steps:
                        break
            result.train_time_s += time.perf_counter() - t0
            result.epochs_run = epoch
            if not eval_every:
                # mvts_transformer's rule (--val_interval): the first, every k-th and the last epoch
                if epoch == 1 or epoch % eval_every_epochs == 0 or epoch == epochs:
                    stop = evaluate_and_select(epoch)
                if bar is not None and bar_unit == "epochs":
                    self.progress.update(bar, advance=1)
            if stop or step >= total_steps:
                break
        result.steps_run = step

        last = self.evaluate("test") if protocol == "holdout" else None
        m = result.metrics
        if max_steps or eval_every:
            m["best_step"], m["steps_run"] = result.best_step, result.steps_run
        if protocol == "holdout":
            final = result.history[-1]
            if (final["epoch"], final["step"]) == (result.best_epoch, result.best_step) and final["step"] == step:
                test = last  # the selected weights are the final ones: evaluated once (rollouts are costly)
            else:
                model.load_state_dict(best_state)
                test = self.evaluate("test")
            selected_row = next(r for r in result.history if r["epoch"] == result.best_epoch and r["step"] == result.best_step)
            m[f"val_{metric.name}"] = m["val_score"] = selected_row[f"val_{metric.name}"]
        else:  # the best evaluation on TEST is the reported number (optimistic by construction)
            best_row = next(r for r in result.history if r["epoch"] == result.best_epoch and r["step"] == result.best_step)
            test = {k[len("test_"):]: v for k, v in best_row.items() if k.startswith("test_")}
            last = {k[len("test_"):]: v for k, v in result.history[-1].items() if k.startswith("test_")}
        m.update(metric=metric.name, higher_is_better=metric.higher_is_better, test_score=test[metric.name],
                 test_score_last=last[metric.name])
        m[f"test_{metric.name}_last"] = last[metric.name]
        m.update({f"test_{k}": v for k, v in test.items()})
        if report_splits:
            model.load_state_dict(best_state)  # the weights whose test metrics are reported
            for split in report_splits:
                # with train_metrics the training batches gave the per-batch metrics of 'train'
                # (keras' logs, what the tables print): the evaluation adds only the others (BLEU)
                wanted = ([x.name for x in self.task.metrics if not x.per_batch]
                          if split == "train" and train_metrics else None)
                if wanted != []:
                    m.update({f"{split}_{k}": v for k, v in self.evaluate(split, wanted).items()})
        if train_metrics:  # the training metrics of the reported (selected) evaluation
            chosen = next(r for r in result.history if r["epoch"] == result.best_epoch and r["step"] == result.best_step)
            m.update({k: v for k, v in chosen.items() if k.startswith("train_")})
        return result
