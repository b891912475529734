"""Time-series extrinsic regression (task=tser): `.ts` regression files in the real format,
mvts_transformer's preprocessing, lower-is-better selection, the record's generic columns."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from bench_cli.commands.cli import main
from bench_cli.core.errors import DataNotFoundError, UserError
from bench_cli.results.csv_store import read_records
from attnbench.tasks.tser import TSERFetcher, TSERRegression


def task_cfg(dataset="RegFixture", protocol="paper", **kw):
    cfg = {"name": "tser", "dataset": dataset, "protocol": protocol, "val_fraction": 0.25, "split_seed": 0,
           "max_len": None, "backbone": {}}
    cfg.update(kw)
    return OmegaConf.create(cfg)


def targets_by_hand(path) -> list[float]:
    """The target of every series: the last ':'-separated field of each line after @data."""
    lines = path.read_text().splitlines()
    data = lines[[line.strip().lower() for line in lines].index("@data") + 1:]
    return [float(line.rsplit(":", 1)[1]) for line in data if line.strip()]


def test_targets_are_fed_unscaled_in_file_order(tser_fixture):
    task = TSERRegression(task_cfg(), tser_fixture.parents[1])
    task.setup("paper")
    for split, name in (("train", "TRAIN"), ("test", "TEST")):
        expected = targets_by_hand(tser_fixture / f"RegFixture_{name}.ts")
        fed = task.splits[split].tensors["y"]
        assert fed.dtype == torch.float32 and len(fed) == len(expected)
        np.testing.assert_allclose(fed.numpy(), np.float32(expected), rtol=0, atol=0)


def test_features_standardised_with_train_statistics_and_padded(tser_fixture):
    task = TSERRegression(task_cfg(protocol="holdout"), tser_fixture.parents[1])
    task.setup("holdout")
    assert {k: len(v) for k, v in task.splits.items()} == {"train": 36, "val": 12, "test": 16}
    x, mask = task.splits["train"].tensors["x"], task.splits["train"].tensors["mask"]
    assert x.shape == (36, task.max_len, 2) and task.max_len == 11
    real = x[mask]
    torch.testing.assert_close(real.mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(real.std(0, unbiased=False), torch.ones(2), atol=1e-4, rtol=0)
    assert not torch.isnan(x).any() and (x[~mask] == 0).all()


def test_classification_files_are_refused_with_one_line(uea_fixture, workdir):
    import shutil

    shutil.copytree(uea_fixture, workdir / "data" / "tser" / "Fixture")
    with pytest.raises(UserError) as e:
        TSERRegression(task_cfg("Fixture"), workdir / "data").setup("paper")
    assert "\n" not in str(e.value) and "targetLabel" in str(e.value)


def test_regression_run_records_rmse_lower_is_better(tser_fixture, workdir):
    main(["run", "task=tser", "task.dataset=RegFixture", "model=attention_bn_sh", "trainer.max_epochs=15",
          "trainer.batch_size=8", "task.backbone.d_model=16", "task.backbone.d_ff=16", "task.backbone.n_layers=1",
          "task.backbone.dropout=0", "trainer.optimizer.lr=1e-2", "results.path=res.csv", "trainer.progress=false"])
    (row,) = read_records(workdir / "res.csv")
    # the target is 3 x the mean of channel 0 (+ noise 0.1): a model that learns predicts it far
    # better than the targets' own spread (what predicting their mean would score)
    spread = float(np.std(targets_by_hand(tser_fixture / "RegFixture_TEST.ts")))
    assert float(row["test_rmse"]) < 0.6 * spread, (row["test_rmse"], spread)
    history = json.loads(row["metrics_json"])["history"]
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    assert row["status"] == "ok" and row["metric"] == "rmse" and row["higher_is_better"] == "False"
    assert math.isfinite(float(row["test_rmse"])) and float(row["test_rmse"]) == float(row["test_score"])
    assert math.isfinite(float(row["test_mae"])) and float(row["test_loss"]) == pytest.approx(float(row["test_rmse"]) ** 2)
    assert row["test_accuracy"] == "" and row["val_score"] == row["val_rmse"]


class ScriptedTask(TSERRegression):
    """A regression task whose evaluations return scripted RMSEs (the history is made by hand)."""

    script: list[float] = []

    def evaluate(self, model, split, ctx):
        value = self.script.pop(0)
        return {"rmse": value, "mae": value, "loss": value * value}


@pytest.mark.parametrize("protocol", ["paper", "holdout"])
def test_selection_keeps_the_lowest_rmse(tser_fixture, protocol):
    from bench_cli.engine.trainer import Trainer

    task = ScriptedTask(task_cfg(protocol=protocol), tser_fixture.parents[1])
    task.setup(protocol)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(1))

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, mask):
            return self.net(x)

    cfg = OmegaConf.create({"batch_size": 16, "eval_batch_size": 16, "max_epochs": 4, "eval_every_epochs": 1,
                            "optimizer": {"name": "sgd", "lr": 1e-3}, "scheduler": {"name": "none"},
                            "early_stopping": {"patience": None}})
    # four evaluations on the selection split (0.5, 0.2, 0.3, 0.4); holdout then evaluates TEST
    # twice more: the last weights (0.9) and the selected ones (0.25)
    ScriptedTask.script = [0.5, 0.2, 0.3, 0.4] + ([0.9, 0.25] if protocol == "holdout" else [])
    result = Trainer(cfg, task, Wrapped(), torch.device("cpu"), seed=0).fit(protocol)
    m = result.metrics
    assert result.best_epoch == 2 and m["metric"] == "rmse" and m["higher_is_better"] is False
    if protocol == "paper":
        assert m["test_score"] == 0.2 and m["test_score_last"] == 0.4 and m["test_rmse_last"] == 0.4
    else:
        assert m["val_score"] == 0.2 and m["test_score"] == 0.25 and m["test_score_last"] == 0.9


def test_fetch_downloads_both_files_and_records_checksums(tser_fixture, tmp_path, monkeypatch):
    import hashlib

    import attnbench.tasks.tser as tser

    served = tmp_path / "served"
    served.mkdir()
    for split in ("TRAIN", "TEST"):
        (served / f"Covid3Month_{split}.ts").write_bytes((tser_fixture / f"RegFixture_{split}.ts").read_bytes())
    monkeypatch.setattr(tser, "ZENODO_URL", served.as_uri() + "/{name}_{split}.ts")
    monkeypatch.setattr(tser, "packaged_dir", lambda name: None, raising=False)
    monkeypatch.setattr("attnbench.tasks.timeseries.packaged_dir", lambda name: None)
    target = TSERFetcher().fetch("Covid3Month", tmp_path / "root")
    sums = (target / "SHA256SUMS").read_text().splitlines()
    digest = hashlib.sha256((served / "Covid3Month_TRAIN.ts").read_bytes()).hexdigest()
    assert f"{digest}  Covid3Month_TRAIN.ts" in sums and len(sums) == 2
    assert (target / "Covid3Month_TEST.ts").is_file()


def test_missing_dataset_is_one_line_and_download_failure_leaves_nothing(tmp_path, monkeypatch):
    import attnbench.tasks.tser as tser

    with pytest.raises(DataNotFoundError) as e:
        TSERRegression(task_cfg("AppliancesEnergy"), tmp_path).check_data()
    assert "\n" not in str(e.value) and "attnbench data tser AppliancesEnergy" in str(e.value)
    monkeypatch.setattr(tser, "ZENODO_URL", (tmp_path / "nowhere").as_uri() + "/{name}_{split}.ts")
    with pytest.raises(DataNotFoundError, match="cannot download"):
        TSERFetcher().fetch("AppliancesEnergy", tmp_path / "root")
    assert not (tmp_path / "root" / "tser" / "AppliancesEnergy").exists()


def test_packaged_sets_run_offline(tmp_path):
    for name in ("Covid3Month", "Tecator"):
        assert TSERFetcher().status(name, tmp_path) == "package"
        TSERRegression(task_cfg(name), tmp_path).check_data()
