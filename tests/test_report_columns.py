"""The report's one column spec (bench_cli/results/report/spec.py), each field exercised on hand-made
records against a hand-made paper CSV: the record column, the paper metric beside it, the filter
that picks the paper's row, ratios to the baseline on both sides, and whether it is a table of its
own, a cell beside the headline table (label, digits) or a cell beside every table."""
from __future__ import annotations

import csv

import pytest

from bench_cli.commands.cli import main
from bench_cli.core.errors import UserError
from bench_cli.results.csv_store import append_record
from bench_cli.results.report import spec

EXP = "primal_dual/table1"  # carries the hand-made report settings below
PAPER = """table,dataset,model,metric,value,std,split,notes,heads
T,Toy,base,accuracy,90.0,1.0,test,,
T,Toy,fast,accuracy,91.0,1.0,test,,
T,Toy,base,accuracy,99.0,,train,,
T,Toy,fast,accuracy,98.0,,train,,
T,Toy,base,loss,0.5,,test,,
T,Toy,fast,loss,0.4,,test,,
T,Toy,base,epoch_time_s,10.0,,,,
T,Toy,fast,epoch_time_s,6.0,,,,
"""
COLUMNS = [
    {"column": "test_accuracy", "paper_metric": "accuracy", "paper_filter": {"split": "test"}, "table": "own"},
    {"column": "train_accuracy", "paper_metric": "accuracy", "paper_filter": {"split": "train"}, "table": "own"},
    {"column": "test_loss", "paper_metric": "loss", "paper_filter": {"split": "test"}, "label": "test loss", "digits": 3},
    {"column": "time_per_epoch_s", "paper_metric": "epoch_time_s", "ratio": True, "label": "time per epoch ×"},
    {"column": "attn_params", "ratio": True, "table": "every", "label": "attn ×"},
]


def record(model, seed, acc, train_acc, loss, epoch_s, attn_params):
    return {"experiment": EXP, "task": "toy", "dataset": "toy", "model": model, "seed": seed, "status": "ok",
            "protocol": "holdout", "variant_key": model, "job_key": f"{model}{seed}", "time": "2026-01-01T00:00:00",
            "epochs_run": 3, "epochs_planned": 3, "test_accuracy": acc, "train_accuracy": train_acc,
            "test_loss": loss, "time_per_epoch_s": epoch_s, "attn_params": attn_params, "params": 1000,
            "flops_forward": 10, "peak_mem_train_bytes": 100, "git_commit": "abc", "torch_version": "2.x",
            "overrides": f"experiment={EXP} model={model} seed={seed}"}


@pytest.fixture
def toy_report(workdir, monkeypatch):
    """Run the report of the hand-made settings; returns (Markdown, files written through write_rows)."""
    from omegaconf import OmegaConf

    from bench_cli.config import compose as composition
    import bench_cli.results.csv_store as csv_store

    (workdir / "results" / "paper").mkdir(parents=True)
    (workdir / "results" / "paper" / "toy.csv").write_text(PAPER)
    real = composition.compose_unchecked

    def compose(overrides, with_hydra=False):
        cfg = real(overrides, with_hydra)
        OmegaConf.set_struct(cfg, False)
        cfg.report = OmegaConf.create({"title": "toy", "paper_csv": "toy.csv", "paper_tables": ["T"], "baseline": "base",
                                       "paper_datasets": {"toy": "Toy"}, "columns": COLUMNS})
        cfg.hydra.sweeper.params = {"model": "base,fast", "seed": "0,1"}
        return cfg

    written = []
    atomic = csv_store.write_rows
    monkeypatch.setattr(composition, "compose_unchecked", compose)
    monkeypatch.setattr(csv_store, "write_rows", lambda path, *a, **k: written.append(path) or atomic(path, *a, **k))
    for seed in (0, 1):
        append_record(workdir / "runs.csv", record("base", seed, 90.0 + seed, 99.0, 0.5, 2.0, 400))
        append_record(workdir / "runs.csv", record("fast", seed, 91.0 + seed, 97.0 + seed, 0.45, 1.0, 100))
    written.clear()
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    return (workdir / "rep" / f"{EXP}.md").read_text(), written


def line(md: str, start: str, section: str | None = None) -> str:
    text = md[md.index(f"## {section}"):] if section else md
    return next(row for row in text.splitlines() if row.startswith(start))


def test_own_table_headline_and_filters(toy_report):
    md, _ = toy_report
    # the first own column is the headline: the paper's test row (split: test), not its train row
    assert line(md, "| toy | fast |").startswith("| toy | fast | 2 | 91.50 ± 0.71 | 91.00 ± 1.00 [TT] | +0.50 | within |")
    # the second has a table of its own, under its column and the filter's values; the train row
    assert "## train_accuracy (paper: accuracy, train)" in md
    assert line(md, "| toy | fast |", "train_accuracy").startswith("| toy | fast | 2 | 97.50 ± 0.71 | 98.00 [TT] | -0.50 |")
    assert "metric: test_accuracy" in md


def test_inline_columns_label_digits_and_ratios(toy_report):
    md, _ = toy_report
    header = line(md, "| dataset")
    assert header.endswith("| time × | attn × | test loss (paper) | time per epoch × (paper) |")
    # test loss: digits 3, ours then the paper's; time: ratios to base on both sides, 1.0/2.0 and 6/10
    # times: ± the spread over the runs (a ratio's propagated from both means), 0 here
    assert line(md, "| toy | fast |").endswith("| 0.25 | 0.450 (0.400) | 0.50 ± 0.00 (0.60) |")
    assert line(md, "| toy | base |").endswith("| 1.00 | 0.500 (0.500) | 1.00 ± 0.00 (1.00) |")
    assert "time per epoch ×: ratio to base, ours `time_per_epoch_s` (mean over the runs)" in md
    # the own table has the every-table columns, not the inline ones
    own = line(md, "| dataset", "train_accuracy")
    assert own.endswith("| time × | attn × |")


def test_csv_columns_and_the_atomic_writer(toy_report, workdir):
    _, written = toy_report
    main_csv, own_csv = workdir / "rep" / f"{EXP}.csv", workdir / "rep" / f"{EXP}.train_accuracy.csv"
    assert written == [main_csv, own_csv]  # both through bench_cli.results.csv_store.write_rows
    with open(main_csv, newline="") as f:
        rows = {r["model"]: r for r in csv.DictReader(f) if r["dataset"] == "toy"}  # not the average rows
    fast = rows["fast"]
    assert fast["attn_params"] == "100.0000" and fast["attn ×"] == "0.2500"  # every: plain mean, then the ratio
    assert fast["test loss"] == "0.4500" and fast["paper_test loss"] == "0.4000"
    assert fast["time per epoch ×"] == "0.5000" and fast["paper_time per epoch ×"] == "0.6000"
    assert fast["time per epoch ×_sd"] == "0.0000" and fast["time per epoch ×_noisy"] == "0"
    with open(own_csv, newline="") as f:
        own = {r["model"]: r for r in csv.DictReader(f) if r["dataset"] == "toy"}
    assert own["fast"]["paper_mean"] == "98.0000" and "test loss" not in own["fast"]


@pytest.mark.parametrize("settings, message", [
    ({"metric": "test_accuracy", "columns": COLUMNS}, "report.metric: replaced by report.columns"),
    ({"also": [], "compare": [], "columns": COLUMNS}, "report.also, report.compare: replaced"),
    ({"columns": [{"column": "x", "table": "own", "colour": "red"}]}, "report.columns[0]: unknown key(s) colour"),
    ({"columns": [{"column": "x", "table": "aside"}]}, "table 'aside' is not one of own, inline, every"),
    ({"columns": [{"column": "x"}]}, "no column with table: own"),
    ({"columns": COLUMNS, "colour": 1}, "unknown report setting(s) colour"),
])
def test_spec_errors_are_one_line(settings, message):
    with pytest.raises(UserError) as e:
        spec.layout(settings)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_layout_places_the_columns():
    lay = spec.layout({"columns": COLUMNS, "rows_by": {"key": "task.backbone.n_heads", "paper_column": "heads"}})
    assert lay.headline.column == "test_accuracy" and [c.column for c in lay.own] == ["train_accuracy"]
    assert [c.name for c in lay.inline] == ["test loss", "time per epoch ×"]
    assert [c.name for c in lay.every] == ["params ×", "FLOPs ×", "mem ×", "time ×", "attn ×"]
    assert lay.rows_by == (spec.RowsBy("task.backbone.n_heads", "heads"),)


def test_an_inline_column_the_paper_does_not_print_says_so_instead_of_naming_none():
    from types import SimpleNamespace

    from bench_cli.results.report.experiment import inline_note

    report = SimpleNamespace(baseline="softmax")
    ours = spec.column({"column": "test_accuracy", "table": "inline", "label": "test accuracy"}, "c")
    assert inline_note(report, ours) == "test accuracy: ours `test_accuracy` (mean over the runs); the paper does not print it."
    theirs = spec.column({"column": "test_loss", "paper_metric": "loss", "label": "test loss"}, "c")
    assert inline_note(report, theirs).endswith("in parentheses, the paper's `loss`.")
