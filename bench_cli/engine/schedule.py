"""How long a fit runs and when it evaluates: epochs or optimiser steps, the step budget, the
evaluation points (``plan_schedule`` from ``trainer.*``; the trainer and `attnbench bench-overhead`'s
bare loop follow the same plan)."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Schedule:
    """How long a fit runs: epochs of ``steps_per_epoch`` optimiser steps (``accum`` loader batches
    each), or ``max_steps`` steps with the loader cycled; evaluations after the first, every
    ``eval_every_epochs``-th and the last epoch, or every ``eval_every`` steps."""

    steps_per_epoch: int
    accum: int
    epochs: int
    total_steps: int
    max_steps: int | None
    eval_every: int | None
    eval_every_epochs: int
    budget: int | None

    @property
    def by_steps(self) -> bool:
        return bool(self.max_steps or self.eval_every)

    def evaluates_after(self, epoch: int) -> bool:
        """mvts_transformer's rule (--val_interval): the first, every k-th and the last epoch."""
        return not self.eval_every and (epoch == 1 or epoch % self.eval_every_epochs == 0 or epoch == self.epochs)

    def evaluates_at_step(self, step: int) -> bool:
        return bool(self.eval_every) and (step % self.eval_every == 0 or step == self.total_steps)


def plan_schedule(cfg, loader_batches: int, accum: int) -> Schedule:
    """``max_steps`` (optimiser steps) replaces ``max_epochs``; ``step_budget`` caps either: at most
    ceil(budget / steps per epoch) whole epochs, or min(max_steps, budget) steps, so a reduced
    budget cuts big datasets and spares small ones."""
    steps_per_epoch = math.ceil(loader_batches / accum)
    max_steps = int(cfg.get("max_steps") or 0) or None
    budget = int(cfg.get("step_budget") or 0) or None
    if budget and max_steps:
        max_steps = min(max_steps, budget)
    epochs = math.ceil(max_steps / steps_per_epoch) if max_steps else int(cfg.max_epochs)
    if budget and not max_steps:
        epochs = min(epochs, math.ceil(budget / steps_per_epoch))
    return Schedule(steps_per_epoch, accum, epochs, max_steps or epochs * steps_per_epoch, max_steps,
                    int(cfg.get("eval_every_steps") or 0) or None, max(1, int(cfg.get("eval_every_epochs") or 1)),
                    budget)
