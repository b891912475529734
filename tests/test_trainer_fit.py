"""Selection, tie-breaking and early stopping through ``Trainer.fit`` on a real model whose weights
change: the composed default config, the UEA fixture (classes separable by the sign of channel 0),
the mvts_transformer encoder, RAdam. Nothing is scripted: every number comes from evaluating the
model. A spy records, at each evaluation of the selection split, the weights and the test metrics
of those weights, so the test can check which weights the reported test numbers came from."""
from __future__ import annotations

import copy

import pytest
import torch

from bench_cli.config.compose import compose
from bench_cli.engine.env import seed_everything
from bench_cli.engine.trainer import Trainer
from bench_cli.core.task import TensorDictDataset
from attnbench.tasks.uea import UEAClassification

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.batch_size=8", "trainer.progress=false"]


class SpiedUEA(UEAClassification):
    """The UEA task, evaluated as usual; each evaluation of the selection split also stores a copy
    of the weights and the TEST metrics of those weights. With ``flip_val`` the validation labels
    are inverted, so validation gets worse while the model learns: selection must pick an early
    evaluation, not the last one, and patience must stop the run."""

    flip_val = False

    def setup(self, protocol):
        super().setup(protocol)
        self.snapshots: list[dict] = []
        if self.flip_val and "val" in self.splits:
            val = self.splits["val"].tensors
            self.splits["val"] = TensorDictDataset(x=val["x"], mask=val["mask"], y=1 - val["y"])

    def evaluate(self, model, split, ctx):
        metrics = super().evaluate(model, split, ctx)
        selecting = "val" if "val" in self.splits else "test"
        if split == selecting and not getattr(self, "_nested", False):
            self._nested = True
            try:
                test = metrics if split == "test" else super().evaluate(model, "test", ctx)
            finally:
                self._nested = False
            self.snapshots.append({"state": copy.deepcopy(model.state_dict()), "test": test, split: metrics})
        return metrics


def fit(workdir, *overrides, flip_val=False, protocol="holdout"):
    cfg = compose([*TINY, f"task.protocol={protocol}", *overrides])
    SpiedUEA.flip_val = flip_val
    task = SpiedUEA(cfg.task, cfg.paths.data_root)
    seed_everything(0)
    task.setup(protocol)
    seed_everything(0)
    model = task.build_model(cfg.model)
    result = Trainer(cfg.trainer, task, model, torch.device("cpu"), seed=0).fit(protocol)
    return task, model, result


def replay_selection(history, split="val"):
    """The documented rule, written out independently: the highest accuracy wins, ties go to the
    lower loss, and a later evaluation replaces the best only when strictly better. Returns the
    index of the selected evaluation and the index at which ``patience`` evaluations without
    improvement have been seen (None if never), for each patience."""
    best, since, stops = None, 0, {}
    for i, row in enumerate(history):
        acc, loss = row[f"{split}_accuracy"], row[f"{split}_loss"]
        if best is None or acc > history[best][f"{split}_accuracy"] or (
                acc == history[best][f"{split}_accuracy"] and loss < history[best][f"{split}_loss"]):
            best, since = i, 0
        else:
            since += 1
            stops.setdefault(since, i)
    return best, stops


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_holdout_reports_the_test_metrics_of_the_selected_weights(uea_fixture, workdir):
    """Validation labels inverted: the model learns TRAIN, so validation accuracy falls and an early
    evaluation is selected. The reported test metrics must be those of the selected weights, and
    the model must be left holding those weights (the reload of the best state)."""
    task, model, result = fit(workdir, "trainer.max_epochs=8", flip_val=True)
    snaps, history = task.snapshots, result.history
    assert len(snaps) == len(history) == 8
    assert not same_weights(snaps[0]["state"], snaps[-1]["state"]), "the weights never changed: nothing trained"
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    chosen, _ = replay_selection(history)
    assert chosen < len(history) - 1, "the scenario needs a selected evaluation before the last one"
    assert (history[chosen]["epoch"], result.best_epoch) == (result.best_epoch, chosen + 1)
    selected = snaps[chosen]
    # the selected weights differ from the last ones in what they score on TEST ...
    assert selected["test"] != snaps[-1]["test"]
    # ... and the record reports the selected weights' TEST metrics, from those very weights
    m = result.metrics
    assert m["test_accuracy"] == selected["test"]["accuracy"] and m["test_loss"] == selected["test"]["loss"]
    assert m["test_score"] == selected["test"]["accuracy"]
    assert m["val_accuracy"] == m["val_score"] == history[chosen]["val_accuracy"]
    assert m["test_score_last"] == snaps[-1]["test"]["accuracy"]
    assert same_weights(model.state_dict(), selected["state"])


def test_ties_on_accuracy_go_to_the_lower_loss(uea_fixture, workdir):
    """The fixture is separable: validation accuracy reaches its maximum at several evaluations,
    whose losses differ. The selected one is the lowest-loss evaluation among them."""
    task, model, result = fit(workdir, "trainer.max_epochs=10", "trainer.optimizer.lr=3e-3")
    history = result.history
    top = max(r["val_accuracy"] for r in history)
    tied = [i for i, r in enumerate(history) if r["val_accuracy"] == top]
    assert len(tied) >= 2, "the scenario needs a tie on the selection metric"
    lowest = min(tied, key=lambda i: history[i]["val_loss"])
    assert lowest != tied[0], "the tie must be broken by the loss, not by the order"
    assert replay_selection(history)[0] == lowest
    assert result.best_epoch == history[lowest]["epoch"]
    assert result.metrics["test_accuracy"] == task.snapshots[lowest]["test"]["accuracy"]
    assert same_weights(model.state_dict(), task.snapshots[lowest]["state"])


@pytest.mark.parametrize("patience", [1, 3])
def test_patience_stops_after_that_many_evaluations_without_improvement(uea_fixture, workdir, patience):
    task, model, result = fit(workdir, "trainer.max_epochs=20", f"trainer.early_stopping.patience={patience}",
                              flip_val=True)
    history = result.history
    _, stops = replay_selection(history)
    assert stops.get(patience) == len(history) - 1, "training must stop at the evaluation where patience runs out"
    assert result.epochs_run == history[-1]["epoch"] < 20
    assert result.metrics["test_accuracy"] == task.snapshots[replay_selection(history)[0]]["test"]["accuracy"]


def test_paper_protocol_reports_the_best_test_evaluation(uea_fixture, workdir):
    """Under the flagged paper protocol TEST itself selects: the reported value is the best test
    accuracy over the evaluations (ties to the lower test loss), and the last one is kept too."""
    task, model, result = fit(workdir, "trainer.max_epochs=6", protocol="paper")
    history = result.history
    chosen, _ = replay_selection(history, split="test")
    m = result.metrics
    assert m["test_accuracy"] == max(r["test_accuracy"] for r in history) == history[chosen]["test_accuracy"]
    assert m["test_loss"] == history[chosen]["test_loss"]
    assert m["test_score_last"] == history[-1]["test_accuracy"]
    assert [s["test"] for s in task.snapshots] == [{k[5:]: v for k, v in r.items() if k.startswith("test_")}
                                                   for r in history]
