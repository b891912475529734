"""What a run shows while it trains (docs/progress.md): the training bar counts optimiser steps
within each epoch, with their rate and the time remaining, and the summary speaks in the
schedule's unit (steps for a step schedule, epochs otherwise)."""
from __future__ import annotations

import io
from types import SimpleNamespace

import torch

from bench_cli.config.compose import compose
from bench_cli.core import ui
from bench_cli.engine.env import seed_everything
from bench_cli.engine.trainer import Trainer
from attnbench.tasks.uea import UEAClassification

TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.batch_size=8", "trainer.progress=false"]


class RecordedBar:
    """The trainer's progress interface (bench_cli.core.ui._Progress), recording every call of the
    training bar: ("count", n), ("description", text), ("status", text)."""

    def __init__(self):
        self.calls, self.total, self.unit, self.train = [], None, None, None

    def add_task(self, description, total, status="", transient=False, unit=""):
        if description == "train":
            self.train, self.total, self.unit = len(self.calls) + 100, total, unit
            return self.train
        return None  # an evaluation's bar

    def advance(self, task_id, n=1):
        pass

    def count(self, task_id, done):
        self.calls.append(("count", done))

    def update(self, task_id, **kw):
        if task_id == self.train:
            self.calls += [(k, v) for k, v in kw.items()]

    def remove_task(self, task_id):
        pass


def fit_with_bar(*overrides) -> RecordedBar:
    cfg = compose([*TINY, *overrides])
    task = UEAClassification(cfg.task, cfg.paths.data_root)
    task.setup("holdout")
    seed_everything(0)
    bar = RecordedBar()
    Trainer(cfg.trainer, task, task.build_model(cfg.model), torch.device("cpu"), seed=0, progress=bar).fit("holdout")
    return bar


def test_the_bar_of_an_epoch_schedule_counts_the_steps_within_each_epoch(uea_fixture, single_thread):
    # 32 training samples (of 40; 8 held out) in batches of 8: 4 steps an epoch, 3 epochs
    bar = fit_with_bar("trainer.max_epochs=3")
    assert (bar.total, bar.unit) == (12, "steps")
    assert [c for c in bar.calls if c[0] == "count"] == [("count", n) for n in range(1, 13)]
    # the epoch is named as it starts; the steps of epoch 1 are counted before its evaluation
    first_status = next(i for i, c in enumerate(bar.calls) if c[0] == "status")
    assert bar.calls[0] == ("description", "epoch 1/3")
    assert [c for c in bar.calls[:first_status] if c[0] == "count"] == [("count", n) for n in range(1, 5)]
    assert ("description", "epoch 3/3") in bar.calls and "@ epoch" in bar.calls[first_status][1]


def test_the_bar_of_a_step_schedule_counts_steps_and_its_status_names_the_step(uea_fixture, single_thread):
    bar = fit_with_bar("trainer.max_steps=6", "trainer.eval_every_steps=3")
    assert (bar.total, bar.unit) == (6, "steps")
    assert [c for c in bar.calls if c[0] == "count"] == [("count", n) for n in range(1, 7)]
    assert not [c for c in bar.calls if c[0] == "description"]  # no epochs: the loader is cycled
    statuses = [c[1] for c in bar.calls if c[0] == "status"]
    assert len(statuses) == 2 and all("@ step" in s for s in statuses)


def test_the_terminal_bar_shows_steps_their_rate_and_time_left(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(ui, "time", SimpleNamespace(monotonic=lambda: now[0]))
    out = io.StringIO()
    monkeypatch.setattr(ui, "console", ui.Console(file=out, force_terminal=True, width=160))
    with ui.progress_bar() as progress:
        progress.remove_task(progress.add_task("eval val", total=None, transient=True))  # as a resumed fit's
        bar = progress.add_task("epoch 1/2", total=1000, status="", unit="steps")
        updates, update = [], progress.p.update
        monkeypatch.setattr(progress.p, "update", lambda task, **kw: (updates.append(kw["completed"]), update(task, **kw)))
        for step in range(1, 1001):
            now[0] = step * 0.01  # a step every 10 ms
            progress.count(bar, step)
        # the bar is redrawn each 0.1 s (every 10th step), and at the last step
        assert len(updates) <= 101 and updates[-1] == 1000
    shown = out.getvalue()
    assert "1000/1000" in shown and "steps/s" in shown


def test_the_summary_of_a_step_schedule_speaks_in_steps(capsys):
    base = dict(run_id="r", status="ok", task="lra", dataset="listops", model="softmax", attention="softmax",
                seed=0, protocol="holdout", test_score=18.0, output_dir="out")
    ui.print_summary({**base, "best_epoch": 1, "epochs_run": 1, "best_step": 20, "steps_run": 20})
    out = capsys.readouterr().out
    assert "best step / steps run" in out and "20 / 20" in out and "epochs run" not in out
    ui.print_summary({**base, "best_epoch": 3, "epochs_run": 5, "best_step": "", "steps_run": 20})
    out = capsys.readouterr().out
    assert "best epoch / epochs run" in out and "3 / 5" in out and "steps run" not in out
