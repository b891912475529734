"""`attnbench report` without an experiment (bench_cli/results/report/grouped.py): any records file grouped
by the columns whose values differ between rows, mean and sample std over seeds per group, each
job_key counted once -- on hand-made records shaped like those of a plain
`attnbench sweep model=a,b seed=0,1`."""
from __future__ import annotations

import csv
import statistics

import pytest

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import append_record, read_records
from bench_cli.results.job_records import one_row_per_job

SHARED = "task=uea task.dataset=Fixture trainer.max_epochs=2"


def plain(model, seed, acc, status="ok", extra="", path="r.csv", **columns):
    """A record of a plain sweep (no experiment): its overrides as `attnbench sweep` writes them."""
    tail = f" {extra}" if extra else ""
    row = {"run_id": f"{model}{seed}{extra}", "time": f"2026-01-01T00:00:0{seed}", "status": status, "task": "uea",
           "dataset": "Fixture", "model": model, "seed": seed, "protocol": "holdout", "experiment": "",
           "job_key": f"{model}-{seed}-{extra}", "variant_key": f"{model}-{extra}", "metric": "accuracy",
           "higher_is_better": "True", "epochs_run": 2, "params": 2722, "time_per_epoch_s": 0.03,
           "overrides": f"{SHARED} results.path={path} model={model} seed={seed}{tail}",
           "command": f"attnbench sweep {SHARED} model=softmax,attention_bn seed=0,1"}
    if status == "ok":
        row["test_score"] = row["test_accuracy"] = acc
    return {**row, **columns}


def report(workdir, *args: str) -> tuple[str, list[dict]]:
    """(the Markdown, the CSV rows) of `attnbench report --records r.csv --out rep ARGS`."""
    main(["report", "--records", str(workdir / "r.csv"), "--out", str(workdir / "rep"), *args])
    with open(workdir / "rep" / "r.csv", newline="") as f:
        return (workdir / "rep" / "r.md").read_text(), list(csv.DictReader(f))


def test_a_plain_sweep_is_grouped_by_model_with_mean_and_std_over_seeds(workdir, capsys):
    accs = {"softmax": (20.0, 50.0), "attention_bn": (55.0, 20.0)}
    for m, values in accs.items():
        for s, a in enumerate(values):
            append_record(workdir / "r.csv", plain(m, s, a))
    md, rows = report(workdir)
    assert "- grouped by: model; mean ± sample std over seeds (2: 0, 1)" in md
    assert "- same in every row: task uea, dataset Fixture, protocol holdout, trainer.max_epochs=2" in md
    assert "| model | n | test accuracy | epochs | params | time/epoch (s) |" in md
    for m, values in accs.items():
        mean, std = statistics.fmean(values), statistics.stdev(values)
        assert f"| {m} | 2 | {mean:.2f} ± {std:.2f} | 2 | 2,722 | 0.0300 ± 0.0000 |" in md
        (row,) = [r for r in rows if r["model"] == m]
        assert float(row["mean"]) == pytest.approx(mean) and float(row["std"]) == pytest.approx(std, abs=1e-4)
        assert row["seeds"] == "0 1"
    assert [r["model"] for r in rows] == ["softmax", "attention_bn"]  # the sweep's order
    assert f"report: `attnbench report --records {workdir / 'r.csv'} --out {workdir / 'rep'}`" in md
    assert "grouped by: model" in capsys.readouterr().out


def test_a_time_taken_on_a_busy_machine_is_shown_with_its_flag(workdir):
    append_record(workdir / "r.csv", plain("softmax", 0, 50.0, time_per_epoch_s=0.02))
    append_record(workdir / "r.csv", plain("softmax", 1, 60.0, time_per_epoch_s=0.06,
                                           timing_noisy="noisy: rerun on an idle machine (load 9.0 on 2 cores)"))
    append_record(workdir / "r.csv", plain("attention_bn", 0, 50.0))
    md, rows = report(workdir)
    assert "| softmax | 2 | 55.00 ± 7.07 | 2 | 2,722 | 0.0400 ± 0.0283 noisy |" in md
    assert "| attention_bn | 1 | 50.00 | 2 | 2,722 | 0.0300 |" in md
    assert "noisy: rerun on an idle machine: 1 run(s)" in md
    assert [r["timing_noisy"] for r in rows] == ["1", "0"] and rows[0]["time_per_epoch_s_std"] != ""


def test_swept_overrides_are_axes_and_failed_seeds_are_gaps_not_zeros(workdir):
    """Two sweeps in one file: model x lr. results.path differs too, but changes no result: not an axis."""
    for m in ("softmax", "attention_bn"):
        for lr, base in (("1e-3", 80.0), ("1e-4", 60.0)):
            for s in (0, 1):
                failed = m == "attention_bn" and lr == "1e-4"
                append_record(workdir / "r.csv", plain(m, s, base + s, status="nan" if failed and s else "ok",
                                                       extra=f"trainer.optimizer.lr={lr}", path=f"{lr}.csv"))
    md, rows = report(workdir)
    assert "- grouped by: model, trainer.optimizer.lr;" in md
    assert "| softmax | 1e-4 | 2 | 60.50 ± 0.71 |" in md
    assert "| attention_bn | 1e-4 | 1 (1 failed) | 60.00 |" in md
    by = {(r["model"], r["trainer.optimizer.lr"]): r for r in rows}
    assert by[("attention_bn", "1e-4")]["n_failed"] == "1" and by[("attention_bn", "1e-4")]["std"] == ""


def test_a_job_key_recorded_twice_counts_once_with_a_note(workdir):
    """Two sweeps ran on one file at once: every job twice. The latest ok row of each counts."""
    for first in (True, False):
        for s, a in enumerate((70.0, 80.0)):
            append_record(workdir / "r.csv", plain("softmax", s, a - 10 if first else a))
    md, rows = report(workdir)
    (row,) = rows
    assert row["n"] == "2" and float(row["mean"]) == pytest.approx(75.0)
    assert "2 duplicate ok rows of an already recorded job_key dropped" in md
    assert len(read_records(workdir / "r.csv")) == 4  # the records file itself is left alone


def test_one_row_per_job_keeps_the_latest_ok_row_and_every_failure():
    rows = [{"job_key": "a", "status": "ok", "v": 1}, {"job_key": "a", "status": "failed", "v": 2},
            {"job_key": "a", "status": "ok", "v": 3}, {"job_key": "b", "status": "nan", "v": 4},
            {"job_key": "b", "status": "nan", "v": 5}, {"job_key": "", "status": "ok", "v": 6},
            {"job_key": "", "status": "ok", "v": 7}]
    kept, dropped = one_row_per_job(rows)
    assert [r["v"] for r in kept] == [2, 3, 4, 5, 6, 7] and dropped == 1


def test_the_default_records_file_and_one_line_errors(workdir, capsys):
    append_record(workdir / "results" / "runs.csv", plain("softmax", 0, 50.0))
    main(["report", "--no-write"])
    assert "grouped by: nothing" in capsys.readouterr().out
    for args, expected in ((["--records", str(workdir / "none.csv")], "none.csv does not exist"),
                           (["--records", str(workdir / "r.csv"), "--width", "0"], "--width 0")):
        with pytest.raises(SystemExit) as e:
            main(["report", *args])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err


def test_latex_of_any_records_file(workdir):
    """`report --records FILE --format latex` of records that name no experiment: the papers'
    display names, a paper column (empty: no paper numbers), a caption counting the one dataset
    and a label; bold where Welch separates the best (45 ± 1 vs 30 ± 1 over two seeds)."""
    for seed, (a, b) in enumerate(((44.0, 29.0), (46.0, 31.0))):
        append_record(workdir / "my.csv", plain("softmax", seed, a, path="my.csv"))
        append_record(workdir / "my.csv", plain("attention_bn", seed, b, path="my.csv"))
    main(["report", "--records", str(workdir / "my.csv"), "--format", "latex", "--out", str(workdir / "out")])
    tex = (workdir / "out" / "my.tex").read_text()
    assert not (workdir / "out" / "my.md").exists() and r"\label{tab:my}" in tex and r"\toprule" in tex
    assert r"Softmax & -- & $\mathbf{45.00 \pm 1.41}$ \\" in tex and r"Attention-BN & -- & $30.00 \pm 1.41$ \\" in tex
    caption = tex.split(r"\caption{")[1].split("}\n")[0]
    assert "(1 dataset)" in caption and "sets)" not in caption and "no paper numbers" in caption
