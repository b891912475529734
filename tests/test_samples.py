"""Per-sample test outputs beside each record (bench_cli/results/samples.py) and the paired
comparison of two models on them (bench_cli/results/report/paired.py, `report --pair A,B`)."""
from __future__ import annotations

import numpy as np
import pytest

from bench_cli.commands.cli import main
from bench_cli.results import samples
from bench_cli.results.csv_store import read_records
from bench_cli.results.report import paired
from test_sweep import sweep, tiny


@pytest.mark.usefixtures("uea_fixture")
def test_records_keep_their_test_outputs_and_report_pairs_two_models(workdir, capsys):
    assert sweep(*tiny(workdir), "trainer.max_epochs=1", "model=softmax,linear", "seed=0,1") == 0
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 4
    for r in rows:  # the file holds the reported test evaluation: its accuracy is the record's
        kept = samples.load(r)
        assert int(r["test_samples"]) == len(kept["target"]) == len(kept["loss"]) > 0
        assert np.mean(kept["prediction"] == kept["target"]) * 100 == pytest.approx(float(r["test_accuracy"]))
        assert np.mean(kept["loss"]) == pytest.approx(float(r["test_loss"]), rel=1e-5)
    capsys.readouterr()
    main(["report", "--records", str(workdir / "res.csv"), "--pair", "softmax,linear", "--width", "200"])
    out = capsys.readouterr().out
    assert "softmax (A) vs linear (B) on the same test samples" in out and "paired bootstrap of A - B" in out
    written = (workdir / "reproduced" / "res.md").read_text()
    (line,) = [x for x in written.splitlines() if x.startswith("| Fixture | 2 |")]  # dataset, seeds both ran
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5].startswith("[") and cells[6].endswith("/2)"), line  # an interval, McNemar over 2 seeds
    assert float(cells[4]) == pytest.approx(float(cells[2]) - float(cells[3]), abs=0.011)


@pytest.mark.usefixtures("uea_fixture")
def test_results_samples_false_keeps_none(workdir):
    main(["run", *tiny(workdir), "trainer.max_epochs=1", "results.samples=false"])
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "ok" and not row["test_samples"] and samples.load(row) is None


def test_paired_statistics_on_known_samples():
    target = np.arange(200) % 2
    right = target.copy()
    wrong_10 = target.copy()
    wrong_10[:20] = 1 - wrong_10[:20]  # B errs on 20 samples A gets right
    assert paired.mcnemar(right == target, wrong_10 == target) == pytest.approx(2 * 0.5 ** 20)
    assert paired.mcnemar(right == target, right == target) == 1.0
    diffs = (right == target).astype(float) * 100 - (wrong_10 == target).astype(float) * 100
    low, high = paired.bootstrap_interval(diffs)
    assert low < diffs.mean() == 10.0 < high and low > 0  # a difference on these samples
    low, high = paired.bootstrap_interval(np.r_[np.full(10, 100.0), np.full(10, -100.0), np.zeros(180)])
    assert low < 0 < high  # as many wins as losses: the interval holds 0
