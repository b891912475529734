"""The training loop: optimiser, schedule, accumulation, device, seeds, auxiliary losses
(Primal-Attention's KSVD objective) and the two evaluation protocols.

Protocols (recorded in every result):
- ``holdout``: a validation split carved from TRAIN selects the epoch (highest val accuracy,
  ties to the lower val loss); the test accuracy of that epoch's weights is reported.
- ``paper``: the papers' practice, the best test accuracy over epochs. Optimistic: the test set
  selects the model. Reported under this name only.
"""
from __future__ import annotations

import copy
import math
import os
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader

from bench_cli.errors import UserError, unknown_choice


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


def make_optimizer(params, cfg) -> torch.optim.Optimizer:
    name, lr, wd = cfg.name, float(cfg.lr), float(cfg.get("weight_decay", 0.0))
    betas = tuple(cfg.get("betas", (0.9, 0.999)))
    eps = float(cfg.get("eps", 1e-8) or 1e-8)  # the LRA PyTorch code uses AdamW eps 1e-6
    makers = {
        "adam": lambda: torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "radam": lambda: torch.optim.RAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd),
        "sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=float(cfg.get("momentum", 0.9)), weight_decay=wd),
    }
    if name not in makers:
        raise unknown_choice("optimizer", name, makers)
    return makers[name]()


def make_scheduler(opt, cfg, total_steps: int, steps_per_epoch: int):
    name, warm = cfg.name, int(cfg.get("warmup_steps", 0) or 0)

    def warmup(step):
        return min(1.0, (step + 1) / warm) if warm else 1.0

    if name == "none":
        return None
    if name == "linear_warmup":
        return torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    if name == "cosine":
        def cosine(step):
            if step < warm:
                return warmup(step)
            progress = (step - warm) / max(1, total_steps - warm)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
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
    raise unknown_choice("scheduler", name, ["none", "linear_warmup", "cosine", "step", "onecycle"])


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def auxiliary_loss(model: torch.nn.Module) -> torch.Tensor | None:
    """Sum of the auxiliary losses of all layers that expose one (e.g. the KSVD objective J)."""
    total = None
    for m in model.modules():
        fn = getattr(m, "auxiliary_loss", None)
        if callable(fn) and m is not model:
            j = fn()
            if j is not None:
                total = j if total is None else total + j
    return total


@dataclass
class TrainResult:
    metrics: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    best_epoch: int = 0
    epochs_run: int = 0
    best_step: int = 0  # optimiser steps at the selected evaluation
    steps_run: int = 0
    train_time_s: float = 0.0


class Trainer:
    def __init__(self, cfg, task, model: torch.nn.Module, device: torch.device, seed: int,
                 eta: float = 0.0, logger=None, progress=None):
        self.cfg, self.task, self.device, self.seed = cfg, task, device, seed
        self.model, self.eta, self.logger, self.progress = model, float(eta or 0.0), logger, progress

    def loader(self, split: str, train: bool) -> DataLoader:
        g = torch.Generator().manual_seed(self.seed)
        bs = int(self.cfg.batch_size if train else self.cfg.eval_batch_size)
        if train and self.cfg.get("micro_batch_size"):  # the batch is accumulated from micro-batches
            bs = min(bs, int(self.cfg.micro_batch_size))
        # Every loader gets its own generator: an iterator without one draws its base seed from the
        # global stream, so evaluating (how often, on which split) would change the dropout of the
        # training that follows.
        return DataLoader(self.task.splits[split], batch_size=bs, shuffle=train, generator=g,
                          num_workers=0, pin_memory=self.device.type == "cuda")

    @torch.no_grad()
    def evaluate(self, split: str) -> dict:
        self.model.eval()
        stats: dict[str, float] = {}
        loader = self.loader(split, train=False)
        bar = self.progress.add_task(f"eval {split}", total=len(loader), transient=True) if self.progress else None
        for batch in loader:
            batch = to_device(batch, self.device)
            out = self.model(**self.task.model_inputs(batch))
            for k, v in self.task.batch_stats(out, batch).items():
                stats[k] = stats.get(k, 0.0) + v
            if bar is not None:
                self.progress.advance(bar)
        if bar is not None:
            self.progress.remove_task(bar)
        return self.task.metrics(stats)

    def training_loss(self, batch: dict) -> torch.Tensor:
        out = self.model(**self.task.model_inputs(batch))
        loss = self.task.loss(out, batch)
        if self.eta:
            j = auxiliary_loss(self.model)
            if j is not None:
                loss = loss + self.eta * j
        return loss

    def fit(self, protocol: str) -> TrainResult:
        """Train, evaluating on the selection split after the first, every ``eval_every_epochs``-th
        and the last epoch or, with ``eval_every_steps``, every that many optimiser steps (the LRA
        code's ``eval_frequency``).
        ``max_steps`` (optimiser steps; the train loader is cycled) replaces ``max_epochs``.
        ``step_budget`` caps either: at most ceil(budget / steps per epoch) whole epochs, or
        min(max_steps, budget) steps, so a reduced budget cuts big datasets and spares small ones."""
        cfg, model, metric = self.cfg, self.model, self.task.metric
        select_split = {"holdout": "val", "paper": "test"}[protocol]
        train_loader = self.loader("train", train=True)
        accum = max(1, int(cfg.get("accumulate_grad_batches", 1)))
        if cfg.get("micro_batch_size"):  # keep the effective batch_size on a small machine
            accum *= math.ceil(int(cfg.batch_size) / train_loader.batch_size)
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
        opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optimizer)
        sched = make_scheduler(opt, cfg.scheduler, total_steps, steps_per_epoch)
        clip = cfg.get("grad_clip")
        patience = cfg.early_stopping.get("patience")
        result, best_key, best_state, since_best = TrainResult(), None, None, 0
        bar_total, bar_unit = (total_steps, "steps") if (max_steps or eval_every) else (epochs, "epochs")
        bar = self.progress.add_task("train", total=bar_total, status="") if self.progress else None
        step, loss_sum, n_batches, stop = 0, 0.0, 0, False

        def evaluate_and_select(epoch: int) -> bool:
            """One evaluation (a history row); True when early stopping says stop."""
            nonlocal best_key, best_state, since_best, loss_sum, n_batches
            row = {"epoch": epoch, "step": step, "train_loss": loss_sum / max(n_batches, 1),
                   "lr": opt.param_groups[0]["lr"]}
            loss_sum, n_batches = 0.0, 0
            selected = self.evaluate(select_split)
            row.update({f"{select_split}_{k}": v for k, v in selected.items()})
            key = (selected[metric], -selected.get("loss", 0.0))
            if best_key is None or key > best_key:
                best_key, result.best_epoch, result.best_step, since_best = key, epoch, step, 0
                best_state = copy.deepcopy(model.state_dict()) if protocol == "holdout" else None
            else:
                since_best += 1
            result.history.append(row)
            if self.logger is not None:
                self.logger.log_epoch(row)
            if bar is not None:
                at = f"step {result.best_step}" if bar_unit == "steps" else result.best_epoch
                self.progress.update(bar, status=f"{select_split} {metric} {selected[metric]:.2f}  "
                                     f"best {best_key[0]:.2f} @ {at}")
            return patience is not None and since_best >= int(patience)

        for epoch in range(1, epochs + 1):
            model.train()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            for i, batch in enumerate(train_loader):
                batch = to_device(batch, self.device)
                loss = self.training_loss(batch)
                if not torch.isfinite(loss):
                    raise DivergedError(f"loss is {loss.item()} at epoch {epoch}, batch {i}")
                (loss / accum).backward()
                loss_sum, n_batches = loss_sum + loss.item(), n_batches + 1
                if (i + 1) % accum == 0 or i + 1 == len(train_loader):
                    if clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    step += 1
                    if sched is not None and step < total_steps:  # the lr after the last step is never used
                        sched.step()
                    if bar is not None and bar_unit == "steps":
                        self.progress.update(bar, advance=1)
                    if eval_every and (step % eval_every == 0 or step == total_steps):
                        result.train_time_s += time.perf_counter() - t0
                        stop = evaluate_and_select(epoch)
                        model.train()
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
            m["test_accuracy_last"] = last[metric]
            model.load_state_dict(best_state)
            test = self.evaluate("test")
            m["val_accuracy"] = best_key[0]
        else:  # the best evaluation on TEST is the reported number (optimistic by construction)
            best_row = next(r for r in result.history if r["epoch"] == result.best_epoch and r["step"] == result.best_step)
            test = {k[len("test_"):]: v for k, v in best_row.items() if k.startswith("test_")}
            m["test_accuracy_last"] = result.history[-1][f"test_{metric}"]
        m["test_accuracy"], m["test_loss"] = test[metric], test.get("loss")
        return result
