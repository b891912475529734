"""The training objective, built once per run: the task's loss plus eta times the auxiliary loss
of the model's auxiliary-loss layers (Primal-Attention's KSVD term, papers/004 Eqn. 8 / Sec. 4),
combined over those layers by ``model.ksvd_layers`` (sum, or the authors' code's mean).

The trainer minimises it, a run's measurements (FLOPs and peak memory of a training step) and
`attnbench profile` measure it: one definition, so a Primal model's recorded training-step FLOPs
and memory include the KSVD term exactly as training computes it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.models.attention import collect_auxiliary_loss


class Objective:
    def __init__(self, task, eta: float = 0.0, layers: str = "sum"):
        self.task, self.eta, self.layers = task, float(eta or 0.0), str(layers)

    @classmethod
    def of(cls, task, model_cfg) -> Objective:
        """The objective a model config asks for: ``eta`` and ``ksvd_layers`` (absent: the task loss)."""
        return cls(task, model_cfg.get("eta", 0.0), model_cfg.get("ksvd_layers", "sum"))

    def __call__(self, model: torch.nn.Module, output, batch: dict) -> torch.Tensor:
        """Task loss of ``output`` on ``batch``, plus eta x the auxiliary loss of ``model``'s last
        forward pass (None until a layer has one: then the task loss alone)."""
        loss = self.task.loss(output, batch)
        if self.eta:
            auxiliary = collect_auxiliary_loss(model, self.layers)
            if auxiliary is not None:
                loss = loss + self.eta * auxiliary
        return loss

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the objective (bench_cli.engine.checkpoint): its settings. No state
        carries over from one step to the next: the KSVD term of a step is computed from that
        step's forward pass (models/attention/primal.py), averaged over its passes only."""
        return {"eta": self.eta, "layers": self.layers}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise ValueError(f"the objective differs: the checkpoint's {state}, this run's {self.state_dict()}")

    def on(self, model: torch.nn.Module, batch: dict) -> Callable:
        """``loss_fn(output)`` of one batch, for the measurements (bench_cli.engine.counting)."""
        return lambda output: self(model, output, batch)
