"""An Optuna trial's pruner inside its run: each evaluation's validation score reported to the study,
the fit stopped when the study's median pruner says so (``tuning.pruner: median``; docs/tuning.md).

The sweep asks the trial (bench_cli/commands/study.py) and hands its job what pruning needs under
PRUNING in the job's columns (the study's storage and name, the trial's id, the metric, the
pruner's settings): plain data, so a job in a launcher's worker process (joblib, Slurm) opens the
same study from its storage. Optuna's ``MedianPruner`` (optuna/pruners/_median.py) stops a trial
whose value at a step is worse than the median of the earlier trials' values at that step, after
``n_startup_trials`` trials have finished and ``n_warmup_steps`` optimiser steps; the step reported
is the optimiser step of the evaluation, so trials of one schedule compare at the same points.
A pruned run is recorded with status ``pruned`` (its validation curve in ``metrics_json``).
"""
from __future__ import annotations

from dataclasses import dataclass

from bench_cli.core.errors import PrunedError

PRUNING = "_pruning"  # the key of a trial job's columns that carries it (popped: never a record column)


@dataclass
class Pruning:
    storage: str
    study: str
    trial_id: int
    metric: str
    startup_trials: int = 5
    warmup_steps: int = 0
    _trial: object = None

    def trial(self):
        if self._trial is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            pruner = optuna.pruners.MedianPruner(n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_steps)
            study = optuna.load_study(study_name=self.study, storage=self.storage, pruner=pruner)
            self._trial = optuna.trial.Trial(study, self.trial_id)
        return self._trial

    def __call__(self, row: dict) -> None:
        """One evaluation (a history row): its validation score reported; PrunedError when the
        pruner stops the trial."""
        value = row.get(f"val_{self.metric}")
        if value is None:
            return
        trial, step = self.trial(), int(row["step"])
        trial.report(float(value), step=step)
        if trial.should_prune():
            raise PrunedError(f"pruned at step {step} by the median pruner: validation {self.metric} {value:.4g} "
                              "is worse than the median of the earlier trials there")


def trial_pruning(columns: dict | None) -> tuple[dict | None, Pruning | None]:
    """(the record's columns, the trial's pruner or None) of a job's columns."""
    if not columns or PRUNING not in columns:
        return columns, None
    rest = {k: v for k, v in columns.items() if k != PRUNING}
    return rest, Pruning(**columns[PRUNING])
