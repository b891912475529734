"""`attnbench report`: aggregation over seeds, gaps, averages over complete rows only, the paper's
numbers side by side, Welch's test, efficiency ratios, the header read from record columns -- on
hand-made records. The column spec's fields: tests/test_report_columns.py."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from bench_cli.results import report
from bench_cli.commands.cli import main
from bench_cli.core.errors import UserError
from bench_cli.results.csv_store import append_record

EXP = "primal_dual/table1"


def rec(dataset, model, seed, acc=None, status="ok", variant="v1", time="2026-01-01T00:00:00", **extra):
    row = {"experiment": EXP, "task": "uea", "dataset": dataset, "model": model, "seed": seed, "status": status,
           "protocol": "paper", "variant_key": f"{dataset}-{model}-{variant}", "job_key": f"{dataset}{model}{seed}{variant}",
           "time": time, "epochs_run": 100, "params": 1000, "flops_forward": 2000, "peak_mem_train_bytes": 4000,
           "time_per_epoch_s": 0.5, "git_commit": "abc", "git_dirty": "false", "torch_version": "2.x",
           "overrides": f"experiment={EXP} task.dataset={dataset} model={model} seed={seed} trainer.max_epochs=100"}
    if acc is not None:
        row["test_accuracy"] = acc
    if status != "ok":
        row["error"] = "RuntimeError: boom"
    row.update(extra)
    return row


def as_csv_rows(rows):
    """What read_records returns: every value a string."""
    return [{k: ("" if v is None else str(v)) for k, v in r.items()} for r in rows]


def test_mean_and_sample_std_over_seeds_and_failed_seeds_are_not_zeros():
    rows = as_csv_rows([rec("JapaneseVowels", "softmax", s, a) for s, a in enumerate([99.0, 98.0, 100.0])]
                       + [rec("JapaneseVowels", "softmax", 3, status="nan"), rec("JapaneseVowels", "softmax", 4, status="oom")])
    cell = report.aggregate(rows, "test_accuracy")[("JapaneseVowels", "softmax")]
    assert cell.n == 3 and cell.mean == pytest.approx(99.0) and cell.std == pytest.approx(1.0)
    assert cell.failed == {"3": "nan", "4": "oom"}


def test_a_seed_rerun_counts_once_and_older_variants_are_ignored():
    rows = as_csv_rows([
        rec("BasicMotions", "softmax", 0, 50.0, variant="old", time="2026-01-01T00:00:00"),
        rec("BasicMotions", "softmax", 1, 50.0, variant="old", time="2026-01-01T00:00:01"),
        rec("BasicMotions", "softmax", 0, 90.0, status="failed", time="2026-01-02T00:00:00"),
        rec("BasicMotions", "softmax", 0, 95.0, time="2026-01-02T00:00:01"),   # --force rerun: the newest ok counts
        rec("BasicMotions", "softmax", 0, 97.0, time="2026-01-02T00:00:02"),
        rec("BasicMotions", "softmax", 1, 99.0, time="2026-01-02T00:00:03"),
    ])
    cell = report.aggregate(rows, "test_accuracy")[("BasicMotions", "softmax")]
    assert cell.values == {"0": 97.0, "1": 99.0} and cell.ignored == 2 and not cell.failed


def test_average_only_over_datasets_where_every_model_has_results():
    rows = as_csv_rows(
        [rec("JapaneseVowels", m, s, a + s) for m, a in (("softmax", 98.0), ("attention_bn", 99.0)) for s in range(2)]
        + [rec("BasicMotions", m, s, a + 2 * s) for m, a in (("softmax", 90.0), ("attention_bn", 94.0)) for s in range(2)]
        + [rec("Epilepsy", "softmax", 0, 10.0)])  # attention_bn missing on Epilepsy
    cells = report.aggregate(rows, "test_accuracy")
    paper = {("japanesevowels", "softmax"): report.PaperValue(99.0, 0.5, "1"),
             ("basicmotions", "softmax"): report.PaperValue(95.0, 1.0, "9")}
    paper_of = lambda d, m: paper.get((d.lower(), m))  # noqa: E731
    avg = report.average_row(cells, ["JapaneseVowels", "BasicMotions", "Epilepsy"], ["softmax", "attention_bn"], paper_of)
    assert avg["datasets"] == ["JapaneseVowels", "BasicMotions"]
    sm = avg["models"]["softmax"]
    assert sm["mean"] == pytest.approx((98.5 + 91.0) / 2)
    # std over seeds of the per-seed averages: seed 0 (98+90)/2 = 94, seed 1 (99+92)/2 = 95.5
    assert sm["std"] == pytest.approx(math.sqrt(((94 - 94.75) ** 2 + (95.5 - 94.75) ** 2) / 1))
    assert sm["paper_mean"] == pytest.approx(97.0)
    assert sm["paper_std"] == pytest.approx(math.sqrt(0.5 ** 2 + 1.0 ** 2) / 2)  # spread of a mean of 2 means
    assert sm["tolerance"] == pytest.approx(max(2 * sm["paper_std"], 1.0))
    assert avg["models"]["attention_bn"]["paper_mean"] is None  # the paper lacks a value on these sets
    assert report.average_row(cells, ["Epilepsy"], ["softmax", "attention_bn"], paper_of) is None
    # one complete dataset: no average (it would repeat that dataset's rows)
    assert report.average_row(cells, ["JapaneseVowels", "Epilepsy"], ["softmax", "attention_bn"], paper_of) is None
    assert report.average_row(cells, ["JapaneseVowels"], ["softmax"], paper_of) is None


def welch_by_hand(m1, s1, n1, m2, s2, n2):
    """Welch's t and its two-sided p, written out: t = (m1 - m2) / sqrt(s1^2/n1 + s2^2/n2) with the
    Welch-Satterthwaite degrees of freedom; p from the t distribution's survival function."""
    from scipy.stats import t as student

    v1, v2 = s1 * s1 / n1, s2 * s2 / n2
    t = (m1 - m2) / math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1 * v1 / (n1 - 1) + v2 * v2 / (n2 - 1))
    return t, 2 * student.sf(abs(t), df)


def sample_with(mean, std, n):
    """n values whose mean and sample standard deviation (ddof 1) are exactly mean and std."""
    z = [i - (n - 1) / 2 for i in range(n)]
    scale = std / math.sqrt(sum(v * v for v in z) / (n - 1))
    return [mean + scale * v for v in z]


def test_welch_and_tolerance():
    from scipy import stats

    t, p = report.welch(99.0, 0.3, 5, 99.46, 0.27, 5)
    # pinned: Welch's two-sided test (Student's pooled t gives p = 0.03426, one-sided p = 0.01728)
    assert t == pytest.approx(-2.548486, abs=1e-6) and p == pytest.approx(0.034555, abs=1e-6)
    assert (t, p) == pytest.approx(welch_by_hand(99.0, 0.3, 5, 99.46, 0.27, 5), rel=1e-9)
    raw = stats.ttest_ind(sample_with(99.0, 0.3, 5), sample_with(99.46, 0.27, 5), equal_var=False)
    assert (t, p) == pytest.approx((raw.statistic, raw.pvalue), rel=1e-9)
    assert report.welch(98.1, 0.5, 3, 99.0, 0.1, 10) == pytest.approx(welch_by_hand(98.1, 0.5, 3, 99.0, 0.1, 10), rel=1e-9)
    assert report.welch(100.0, 0.0, 5, 100.0, 0.0, 5) == (0.0, 1.0)
    assert report.welch(99.0, 0.0, 1, 99.0, 0.3, 5) == (None, None)
    cells = report.aggregate(as_csv_rows([rec("JapaneseVowels", "softmax", s, a) for s, a in enumerate([98.0, 98.2, 98.4])]),
                        "test_accuracy")
    paper = {("japanesevowels", "softmax"): report.PaperValue(99.46, 0.27, "1")}
    (row,) = report.build_rows(cells, ["JapaneseVowels"], ["softmax"], lambda d, m: paper.get((d.lower(), m)),
                          lambda d, m: (cells.get((d, "softmax")), "softmax"), 5)
    assert row["diff"] == pytest.approx(98.2 - 99.46) and row["tolerance"] == 1.0 and row["within_tolerance"] is False
    # three seeds 98.0, 98.2, 98.4: mean 98.2, sample standard deviation 0.2 (by hand)
    assert row["mean"] == pytest.approx(98.2, abs=1e-12) and row["std"] == pytest.approx(0.2, abs=1e-12) and row["n"] == 3
    assert (row["welch_t"], row["welch_p"]) == pytest.approx(welch_by_hand(98.2, 0.2, 3, 99.46, 0.27, 5), rel=1e-9)
    assert row["within_spread"] is False and row["welch_p"] < 0.05


def test_tost_is_two_one_sided_welch_tests_and_the_only_match():
    """Equivalence within the margin (TOST): the larger p of two one-sided Welch tests of the
    samples shifted by the margin, as scipy computes them from raw samples; a large Welch p with a
    wide spread is "no evidence of a difference", never "matches"."""
    from scipy import stats

    mine, paper = sample_with(98.9, 0.3, 5), sample_with(99.0, 0.27, 5)
    by_scipy = max(stats.ttest_ind([v + 1.0 for v in mine], paper, equal_var=False, alternative="greater").pvalue,
                   stats.ttest_ind([v - 1.0 for v in mine], paper, equal_var=False, alternative="less").pvalue)
    assert report.stats.tost(98.9, 0.3, 5, 99.0, 0.27, 5, 1.0) == pytest.approx(by_scipy, rel=1e-9) and by_scipy < 0.05
    assert report.stats.tost(98.9, 3.0, 5, 99.0, 2.7, 5, 1.0) > 0.05  # the same means, a wide spread: not shown
    assert report.welch(98.9, 3.0, 5, 99.0, 2.7, 5)[1] > 0.05       # ... though Welch finds no difference either
    cells = report.aggregate(as_csv_rows([rec("JapaneseVowels", "softmax", s, a) for s, a in enumerate([95.0, 99.0, 103.0])]),
                        "test_accuracy")
    paper_value = report.PaperValue(99.0, 0.3, "1")
    (row,) = report.build_rows(cells, ["JapaneseVowels"], ["softmax"], lambda d, m: paper_value,
                          lambda d, m: (cells.get((d, "softmax")), "softmax"), 5)
    shown = report.display_rows([row], None, ["softmax"], columns=())[0]
    assert shown[6:9] == ["within", f"no evidence of a difference (p={row['welch_p']:.2f})",
                          f"not shown (p={row['tost_p']:.2f})"] and row["equivalent"] is False


def test_paper_n_per_dataset_tests_each_row_with_its_count_and_none_for_one_run():
    """report.paper_n as a mapping: Welch's n per dataset (``default`` for the others); a dataset
    the paper ran once has no spread to test against: no test, never a division by zero."""
    from bench_cli.results.report.spec import paper_runs

    runs = paper_runs({"default": 5, "imagenet": 1})
    assert (runs.of("mnist"), runs.of("imagenet"), str(runs)) == (5, 1, "5 (imagenet 1)")
    assert paper_runs(3) == paper_runs({"default": 3}) and paper_runs(None).of("any") == 5  # the scalar form
    rows = as_csv_rows([rec(d, "standard", s, a) for d in ("mnist", "imagenet") for s, a in enumerate([98.0, 98.2, 98.4])])
    cells = report.aggregate(rows, "test_accuracy")
    paper = {d: report.PaperValue(99.46, 0.27, "1") for d in ("mnist", "imagenet")}
    out = report.build_rows(cells, ["mnist", "imagenet"], ["standard"], lambda d, m: paper[d],
                       lambda d, m: (cells.get((d, "standard")), "standard"), runs.of)
    by = {r["dataset"]: r for r in out}
    assert (by["mnist"]["welch_t"], by["mnist"]["welch_p"]) == pytest.approx(welch_by_hand(98.2, 0.2, 3, 99.46, 0.27, 5))
    assert by["imagenet"]["welch_p"] is None and by["imagenet"]["within_spread"] is None and by["imagenet"]["paper_n"] == 1
    assert by["imagenet"]["within_tolerance"] is False  # the tolerance still compares
    for bad in (0, "five", {"imagenet": 0}, {"default": 2.5}):
        with pytest.raises(UserError, match="report.paper_n.*not a positive integer"):
            paper_runs(bad)


def test_table1_report_says_imagenet_is_one_run_without_a_test(workdir):
    exp = "pay_better_attention/table1"
    for d, seeds in (("mnist", range(5)), ("imagenet", [0])):
        for s in seeds:
            append_record(workdir / "runs.csv", rec(d, "standard", s, 90.0 + s, experiment=exp, task="vit", overrides=(
                f"experiment={exp} task.dataset={d} model=standard seed={s}")))
    main(["report", exp, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "pay_better_attention" / "table1.md").read_text()
    assert "; paper n assumed 5 (imagenet 1)" in md
    assert ("No Welch test for imagenet: the paper's number there is one run (report.paper_n), which has no spread "
            "to test against.") in md


def test_gaps_stay_gaps_and_efficiency_is_a_ratio_to_softmax():
    rows = as_csv_rows([rec("JapaneseVowels", "softmax", 0, 99.0),
                        rec("JapaneseVowels", "attention_sh", 0, 98.0, flops_forward=1500, peak_mem_train_bytes=3000),
                        rec("JapaneseVowels", "attention_bn", 0, status="failed")])
    cells = report.aggregate(rows, "test_accuracy")
    out = report.build_rows(cells, ["JapaneseVowels"], ["softmax", "attention_bn", "attention_sh", "attention_bn_sh"],
                       lambda d, m: None, lambda d, m: (cells.get((d, "softmax")), "softmax"), 5)
    by = {r["model"]: r for r in out}
    assert by["attention_bn"]["n"] == 0 and by["attention_bn"]["mean"] is None and by["attention_bn"]["n_failed"] == 1
    assert by["attention_bn_sh"]["n"] == 0 and by["attention_bn_sh"]["mean"] is None
    assert by["attention_sh"]["flops_ratio"] == pytest.approx(0.75) and by["attention_sh"]["mem_ratio"] == pytest.approx(0.75)
    assert by["softmax"]["params_ratio"] == 1.0
    shown = report.display_rows(out, None, [])
    assert [r[3] for r in shown] == ["99.00", "—", "98.00", "—"]  # a gap is never a 0; one run has no std
    (gap,) = [r for r in report.csv_rows(out, None, []) if r["model"] == "attention_bn_sh"]
    assert list(gap.values())[:7] == ["JapaneseVowels", "attention_bn_sh", "attention_bn_sh", "0", "0", "", ""]


def test_paper_values_from_the_reference_csv():
    from omegaconf import OmegaConf

    values, avg = report.load_paper(OmegaConf.create({"paper_csv": "primal_dual_2023.csv", "paper_tables": ["1", "9"]}),
                               "accuracy")
    assert values[("japanesevowels", "softmax")].mean == 99.46 and values[("japanesevowels", "softmax")].std == 0.27
    assert values.get(("japanesevowels", "no_such_model")) is None
    assert values[("basicmotions", "attention_bn_sh")].table == "9"
    assert values[("handwriting", "attention_bn")].mean == 33.17  # 'HandWriting' in the paper
    assert avg["softmax"].mean == 72.07
    values, _ = report.load_paper(OmegaConf.create({"paper_csv": "primal_attention_main.csv", "paper_tables": ["1"]}))
    assert values[("japanesevowels", "transformer")].mean == 98.7 and values[("japanesevowels", "transformer")].std is None


def test_report_command_writes_markdown_and_csv(workdir, capsys):
    for m, accs in (("softmax", [99.5, 99.2, 99.7]), ("attention_bn", [99.4, 99.6, 99.5]),
                    ("attention_sh", [99.1, 99.3, 99.5]), ("attention_bn_sh", [99.6, 99.5, 99.4])):
        for s, a in enumerate(accs):
            append_record(workdir / "runs.csv", rec("JapaneseVowels", m, s, a))
    append_record(workdir / "runs.csv", rec("BasicMotions", "softmax", 0, 100.0))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    out = capsys.readouterr().out
    assert "protocol: paper" in out and "seeds: 3" in out
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "| JapaneseVowels | softmax | 3 | 99.47 ± 0.25 | 99.46 ± 0.27 [T1] | +0.01 | within |" in md
    assert "| BasicMotions | attention_bn | 0 | — | 99.38 ± 1.08 [T9] |" in md
    # BasicMotions lacks three models: nothing to average over, said once
    assert "Average (" not in md and "Only JapaneseVowels has results for every model: no average row." in md
    with open(workdir / "rep" / "primal_dual" / "table1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["dataset"] == "JapaneseVowels" and rows[0]["paper_mean"] == "99.4600"


def test_header_states_the_step_budget_and_the_epochs_from_record_columns(workdir, monkeypatch):
    """The budget and the epochs come from the records' step_budget / epochs_planned / epochs_run
    columns, not from their overrides (which say nothing of a budget here), and no config is
    composed for them: the report composes its experiment once."""
    from bench_cli.config import compose as composition

    real, composed = composition.compose_unchecked, []

    def compose_once(overrides, with_hydra=False):
        composed.append(overrides)
        return real(overrides, with_hydra)

    monkeypatch.setattr(composition, "compose_unchecked", compose_once)
    for ds, planned, run in (("JapaneseVowels", 100, 100), ("BasicMotions", 400, 380)):
        for s in range(2):
            append_record(workdir / "runs.csv", rec(ds, "softmax", s, 99.0, epochs_run=run - s, epochs_planned=planned,
                                                    step_budget=500))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "- epochs: JapaneseVowels 99/100; BasicMotions 379/380;" in md
    assert ("- budget: trainer.step_budget=500: the experiment's own trainer.max_epochs cut to at most "
            "ceil(500 / optimiser steps per epoch) whole epochs; planned epochs: JapaneseVowels 100, BasicMotions 400") in md
    assert composed == [[f"experiment={EXP}"]]


def test_report_errors_are_one_line(workdir, capsys):
    (workdir / "empty.csv").write_text("experiment,seed\n")
    for args, expected in ((["no/such"], "unknown experiment 'no/such'"),
                           ([EXP, "--records", str(workdir / "none.csv")], f"--records {workdir / 'none.csv'}: no such file"),
                           ([EXP, "--records", str(workdir / "empty.csv")], "no records of experiment"),
                           ([EXP, "--bogus"], "unknown option '--bogus'")):
        with pytest.raises(SystemExit) as e:
            main(["report", *args])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


def test_rows_split_by_a_variant_key_match_the_papers_rows_by_notes(workdir, monkeypatch):
    from omegaconf import OmegaConf

    from bench_cli.config import compose as composition

    real = composition.compose_unchecked

    def compose(overrides, with_hydra=False):  # a Table 11 style experiment: rows by beta_learnable
        cfg = real(overrides, with_hydra)
        OmegaConf.set_struct(cfg, False)
        cfg.report = OmegaConf.create({"paper_csv": "primal_dual_2023.csv", "paper_tables": ["11"], "paper_n": 5,
                                       "paper_datasets": {"aan": "Retrieval"}, "baseline": "attention_bn",
                                       "columns": [{"column": "test_accuracy", "paper_metric": "accuracy", "table": "own"}],
                                       "rows_by": {"key": "model.attention.beta_learnable",
                                                   "paper_notes": {"true": "beta learned",
                                                                   "false": "beta set as hyperparameter"}}})
        cfg.hydra.sweeper.params = {"model": "attention_bn,attention_bn_sh",
                                    "model.attention.beta_learnable": "true,false", "seed": "0,1"}
        return cfg

    monkeypatch.setattr(composition, "compose_unchecked", compose)
    for m in ("attention_bn", "attention_bn_sh"):
        for learn, acc in (("true", 80.8), ("false", 81.0)):
            for s in (0, 1):
                r = rec("aan", m, s, acc + s / 10, variant=learn)
                r["overrides"] += f" model.attention.beta_learnable={learn}"
                append_record(workdir / "runs.csv", r)
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "| aan | attention_bn (beta_learnable=true) | 2 | 80.85 ± 0.07 | 80.77 ± 0.23 [T11] |" in md
    assert "| aan | attention_bn_sh (beta_learnable=false) | 2 | 81.05 ± 0.07 | 81.20 ± 0.11 [T11] |" in md


SUPP1 = "primal_attention/supp_table1"


def test_rows_split_by_two_keys_match_the_papers_row_of_both(workdir, capsys):
    """Supplement Table 1 (s x eta): 2 s x 2 eta values of records give 4 rows, each next to the
    paper's value of its (s, eta) (reference CSV, EthanolConcentration); the grid's other 8
    combinations have no records: one note, no rows."""
    paper = {("20", "0.0"): "32.30", ("20", "0.1"): "31.60", ("30", "0.0"): "30.00", ("30", "0.1"): "33.10"}
    for i, (s, eta) in enumerate(paper):
        for seed in (0, 1):
            append_record(workdir / "runs.csv", rec(
                "EthanolConcentration", "primalformer", seed, 40.0 + i + seed, variant=f"{s}-{eta}",
                experiment=SUPP1, job_key=f"{s}{eta}{seed}",
                overrides=f"experiment={SUPP1} task.dataset=EthanolConcentration model=primalformer "
                          f"model.attention.low_rank={s} model.eta={eta} seed={seed}"))
    main(["report", SUPP1, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_attention" / "supp_table1.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| EthanolConcentration")]
    assert len(rows) == 4
    for i, ((s, eta), value) in enumerate(paper.items()):
        assert rows[i].startswith(f"| EthanolConcentration | primalformer (low_rank={s}, eta={eta}) | 2 | "
                                  f"{40.5 + i:.2f} ± 0.71 | {value} [T1] |"), rows[i]
    assert "Not run (no records in runs.csv): primalformer (low_rank=20, eta=0.2), " in md
    assert md.count("low_rank=40") == 4   # the not-run combinations are named once each


@pytest.mark.parametrize("rows_by, message", [
    ([{"key": "model.eta"}, {"paper_column": "eta"}], "report.rows_by[1]: no `key`"),
    ({"key": "model.eta", "column": "eta"}, "report.rows_by: unknown key(s) column"),
])
def test_rows_by_errors_are_one_line(rows_by, message):
    with pytest.raises(UserError) as e:
        report.layout({"columns": [{"column": "test_accuracy", "table": "own"}], "rows_by": rows_by})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_models_without_records_are_noted_once_and_the_others_keep_their_average(workdir):
    """Two of the grid's four models ran on both datasets: their rows and average rows stay, the
    other two are one note, not a row of gaps per dataset."""
    for d in ("JapaneseVowels", "BasicMotions"):
        for m, acc in (("softmax", 98.0), ("attention_bn", 99.0)):
            for s in (0, 1):
                append_record(workdir / "runs.csv", rec(d, m, s, acc + s))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "| Average (2 sets) | softmax | 2 | 98.50 ± 0.71 |" in md
    assert "| Average (2 sets) | attention_bn | 2 | 99.50 ± 0.71 |" in md
    assert "attention_sh |" not in md and "Gaps" not in md
    assert "Not run (no records in runs.csv): attention_sh, attention_bn_sh." in md
    # a third dataset where one model lacks results: the average of the other two says so
    append_record(workdir / "runs.csv", rec("Epilepsy", "softmax", 0, 90.0))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "| Average (2 sets) | softmax | 2 | 98.50 ± 0.71 |" in md
    assert "The average leaves out Epilepsy: no result for attention_bn." in md
    # a model with records on one dataset only: its gap stays a row, the average leaves that dataset out
    append_record(workdir / "runs.csv", rec("JapaneseVowels", "attention_sh", 0, 97.0))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "| BasicMotions | attention_sh | 0 | — |" in md and "Average (" not in md
    assert "Only JapaneseVowels has results for every model: no average row." in md
    assert "Not run (no records in runs.csv): attention_bn_sh." in md


def test_logger_wandb_logs_the_table(workdir, monkeypatch):
    from bench_cli.results import loggers

    logged = {}

    class Capture(loggers.NullLogger):
        def log_table(self, name, rows):
            logged[name] = rows

        def finish(self, status="ok"):
            logged["finished"] = status

    monkeypatch.setattr(loggers, "make_logger", lambda cfg, config, run_dir, name, job_type="run":
                        logged.setdefault("kind", (cfg.name, job_type)) and Capture())
    append_record(workdir / "runs.csv", rec("JapaneseVowels", "softmax", 0, 99.0))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--no-write", "logger=wandb"])
    assert logged["kind"] == ("wandb", "report") and logged["finished"] == "ok"
    (row,) = [r for r in logged[f"report/{EXP}"] if r["model"] == "softmax"]
    assert row["mean"] == 99.0 and row["paper_mean"] == 99.46


def test_small_values_keep_three_significant_digits():
    """An RMSE of 0.05 must not print as 0.05 ± 0.00; accuracies keep two decimals."""
    from bench_cli.core.ui import mean_pm as _pm

    assert _pm(0.05432, 0.00311) == "0.0543 ± 0.0031"
    assert _pm(98.8108, 0.3111) == "98.81 ± 0.31"
    assert _pm(6.2617, None) == "6.26"


# --- the report for people: 80 columns, the re-run command, each job counted once --------------------
def table1_records(path, accs=((99.5, 99.2), (99.4, 99.6))):
    for m, values in zip(("softmax", "attention_bn"), accs):
        for s, a in enumerate(values):
            append_record(path, rec("JapaneseVowels", m, s, a))


@pytest.mark.parametrize("columns, width", [("72", None), (None, None), ("200", "64")])
def test_redirected_report_fits_columns_or_width_and_never_cuts_a_name(workdir, capsys, monkeypatch, columns, width):
    """Redirected (capsys is no terminal): COLUMNS, else 80; --width wins over COLUMNS. A word longer
    than the width (the records path) gets a line of its own, whole."""
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    records = workdir / ("records_of_a_sweep_under_a_file_name_longer_than_any_line_of_the_report" * 2 + ".csv")
    table1_records(records)
    main(["report", EXP, "--records", str(records), "--out", str(workdir / "rep"), *(["--width", width] if width else [])])
    lines = capsys.readouterr().out.splitlines()
    limit = int(width or columns or 80)
    too_long = [line for line in lines if len(line) > limit]
    assert too_long and all(" " not in line.strip() for line in too_long), too_long  # only the unbreakable path
    assert any(line.strip() == str(records) for line in lines)
    assert any(line.strip() == "attention_bn" or "model: attention_bn" in line for line in lines)


def test_a_wide_width_prints_one_line_per_row(workdir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    table1_records(workdir / "runs.csv")
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--no-write", "--width", "260"])
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "attention_bn " in line and "JapaneseVowels" in line]
    assert "99.50 ± 0.14" in row and len(row) <= 260 and max(map(len, out.splitlines())) > 80
    with pytest.raises(SystemExit) as e:
        main(["report", EXP, "--records", str(workdir / "runs.csv"), "--width", "wide"])
    assert e.value.code == 2 and "--width wide" in capsys.readouterr().err


def test_footer_reruns_the_command_that_wrote_the_file(workdir, capsys):
    """The report line of the written Markdown, run as it stands, rewrites the same file."""
    import shlex

    table1_records(workdir / "runs.csv")
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "out dir"), "--all"])
    md = workdir / "out dir" / "primal_dual" / "table1.md"
    first = md.read_text()
    (command,) = [part.split("`")[1] for line in first.splitlines() if line.startswith("- sweep:")
                  for part in line.split("; ") if part.startswith("report: ")]
    assert command == (f"attnbench report {EXP} --records {workdir / 'runs.csv'} "
                       f"--out {shlex.quote(str(workdir / 'out dir'))} --all")
    md.unlink()
    main(shlex.split(command)[1:])
    assert md.read_text() == first


def test_a_job_key_recorded_twice_counts_once_and_the_report_says_so(workdir, capsys):
    """Two sweeps ran softmax seed 1 (one job_key, two ok rows): the latest row counts, once."""
    table1_records(workdir / "runs.csv")
    append_record(workdir / "runs.csv", rec("JapaneseVowels", "softmax", 1, 90.0, time="2026-01-01T00:00:09"))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert "| JapaneseVowels | softmax | 2 | 94.75 ± 6.72 |" in md  # seeds 0 and 1: 99.5 and the latest 90.0
    assert "1 duplicate ok row of an already recorded job_key dropped" in md
    assert "4 runs" in md


def test_wall_clock_charges_the_time_with_runs_in_progress_not_a_pause_between_sittings():
    from bench_cli.results.report.common import wall_clock

    rows = [{"time": "2026-01-01T10:00:00+00:00", "wall_time_s": 600},   # two workers, overlapping
            {"time": "2026-01-01T10:05:00+00:00", "wall_time_s": 600},
            {"time": "2026-01-01T10:15:30+00:00", "wall_time_s": 30},    # a short gap: the same sitting
            {"time": "2026-01-01T13:00:00+00:00", "wall_time_s": 300},   # resumed three hours later
            {"time": "not a time", "wall_time_s": 5}]
    assert wall_clock(rows) == ("20.5 min with runs in progress (185.0 min from the first run's start to the "
                                "last run's end, in 2 sittings; 25.5 min of runs)")
    assert wall_clock(rows[:2]) == "15.0 min with runs in progress (15.0 min from the first run's start to the last run's end; 20.0 min of runs)"
    assert wall_clock([{"time": None}]) is None


def test_an_experiments_budget_in_words_leads_the_budget_lines():
    from types import SimpleNamespace

    from bench_cli.results.report.experiment import budget_lines

    rows = [{"step_budget": "500", "overrides": "[]"}]
    stated = SimpleNamespace(used=rows, datasets=[], settings={"budget": "400 steps of batch 32"})
    assert budget_lines(stated, ())[:2] == [
        "budget: 400 steps of batch 32",
        "budget: trainer.step_budget=500: the experiment's own trainer.max_epochs cut to at most "
        "ceil(500 / optimiser steps per epoch) whole epochs"]
    assert budget_lines(SimpleNamespace(used=[], datasets=[], settings={}), ()) == []


def test_the_committed_reproduction_beside_yours_each_tested_against(workdir, capsys):
    """--committed: per cell the paper, the committed runs and yours, Welch's test against each."""
    table1_records(workdir / "mine.csv")
    table1_records(workdir / "committed.csv", accs=((90.0, 91.0), (99.4, 99.6)))
    main(["report", EXP, "--records", str(workdir / "mine.csv"), "--committed", str(workdir / "committed.csv"),
          "--out", str(workdir / "rep")])
    out = capsys.readouterr().out
    assert f"read {workdir / 'committed.csv'} (4 runs of {EXP}: the committed reproduction)" in out.replace("\n  ", " ")
    md = (workdir / "rep" / "primal_dual" / "table1.md").read_text()
    assert ("| n | yours | paper | Δ | paper's interval ±max(2σ, 1) | Welch vs paper | equivalent ±max(2σ, 1) (TOST) "
            "| committed | Welch vs committed |") in md
    assert "| JapaneseVowels | softmax | 2 | 99.35 ± 0.21 | 99.46 ± 0.27 [T1] | +" not in md
    assert "| 90.50 ± 0.71 (n 2) | differs (p=0.02) |" in md            # softmax: 99.35 against 90.5
    assert "| 99.50 ± 0.14 (n 2) | no evidence of a difference (p=1.00) |" in md  # attention_bn: the same runs
    with open(workdir / "rep" / "primal_dual" / "table1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["committed_mean"] == "90.5000" and rows[1]["matches_committed"] == "true"


def test_report_finds_your_records_and_the_committed_ones_from_any_folder(workdir, capsys, monkeypatch):
    """Without --records: the user's results/local records and the committed ones, found relative
    to the project (not the working folder); it says which files it read and writes to results/local."""
    from bench_cli.results.report import experiment as experiment_report

    project = workdir / "project"
    monkeypatch.setattr(experiment_report, "LOCAL", project / "results" / "local")
    monkeypatch.setattr(experiment_report, "COMMITTED", project / "results" / "reproduced")
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(SystemExit):
        main(["report", EXP, "--no-write"])
    assert "no records of experiment" in capsys.readouterr().err
    committed = project / "results" / "reproduced" / f"{EXP}.records.csv"
    table1_records(committed)
    main(["report", EXP, "--no-write"])
    out = capsys.readouterr().out.replace("\n  ", " ")
    assert f"read {committed} (4 runs of {EXP})" in out and "committed" not in out.split("records:")[0].split("\n", 1)[1]
    mine = project / "results" / "local" / f"{EXP}.records.csv"
    table1_records(mine, accs=((90.0, 91.0), (99.4, 99.6)))
    main(["report", EXP])
    out = capsys.readouterr().out.replace("\n  ", " ")
    assert f"read {mine} (4 runs of {EXP})" in out and f"read {committed} (4 runs of {EXP}: the committed" in out
    md = (project / "results" / "local" / "primal_dual" / "table1.md").read_text()
    assert "| 90.50 ± 0.71 | 99.46 ± 0.27 [T1] |" in md and "| 99.35 ± 0.21 (n 2) |" in md
    assert f"report: `attnbench report {EXP} --out {project / 'results' / 'local'}`" in md


def committed_reports() -> list[str]:
    """Every committed report (.md) that names the report command that wrote it."""
    import subprocess

    from bench_cli.results.provenance import PROJECT_ROOT

    tracked = subprocess.run(["git", "ls-files", "results"], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout
    return [p for p in tracked.split() if p.endswith(".md") and any(
        line.startswith("- sweep:") and "report: `attnbench report " in line for line in (PROJECT_ROOT / p).read_text().splitlines())]


@pytest.mark.parametrize("committed_path", committed_reports())
def test_a_committed_report_regenerates_from_its_own_report_line(committed_path, workdir, capsys, monkeypatch):
    """Each committed report: its report command (run from the project root, into a temp folder)
    rewrites it byte for byte, the new headers included (report code changes keep them true)."""
    import shlex

    from bench_cli.results.provenance import PROJECT_ROOT

    committed = (PROJECT_ROOT / committed_path).read_text()
    (line,) = [line for line in committed.splitlines() if line.startswith("- sweep:")]
    command = line.split("report: `")[1].split("`")[0]
    made_by = line.split("made by `")[1].split("`")[0] if "made by `" in line else None
    if made_by:
        monkeypatch.setenv("ATTNBENCH_MADE_BY", made_by)
    monkeypatch.chdir(PROJECT_ROOT)
    args = shlex.split(command)[1:]
    out = args[args.index("--out") + 1]
    main([*args[:args.index("--out")], "--out", str(workdir / "out"), *args[args.index("--out") + 2:]])
    regenerated = (workdir / "out" / Path(committed_path).relative_to(out)).read_text()
    assert regenerated.replace(f"--out {workdir / 'out'}", f"--out {out}") == committed


def test_the_table1_report_says_what_a_cell_means():
    from bench_cli.results.provenance import PROJECT_ROOT

    table = (PROJECT_ROOT / "results/reproduced/primal_dual/table1.md").read_text()
    assert "| paper's interval ±max(2σ, 1) | Welch vs paper | equivalent ±max(2σ, 1) (TOST) |" in table


def test_latex_table_booktabs_paper_beside_ours_bold_only_where_welch_separates(workdir):
    """--format latex: NAME.tex beside nothing else asked for; the papers' display names, per dataset
    the paper's value beside ours, bold only where Welch's test separates the best from the second
    (BasicMotions: 97.5 vs 92.5, p = 0.02; not JapaneseVowels: 99.50 vs 99.35, p = 0.5), a caption
    that counts the datasets shown (the title's "(10 sets)" is not this table's) and a label."""
    table1_records(workdir / "runs.csv", accs=((99.5, 99.2), (99.4, 99.6)))
    for s, a in enumerate((97.0, 98.0)):
        append_record(workdir / "runs.csv", rec("BasicMotions", "softmax", s, a, higher_is_better="true"))
        append_record(workdir / "runs.csv", rec("BasicMotions", "attention_bn", s, a - 5, higher_is_better="true"))
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep"), "--format", "latex"])
    tex = (workdir / "rep" / "primal_dual" / "table1.tex").read_text()
    assert not (workdir / "rep" / "primal_dual" / "table1.md").exists()
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"\label{tab:primal_dual-table1}" in tex
    assert (r" & \multicolumn{2}{c}{JapaneseVowels} & \multicolumn{2}{c}{BasicMotions} & \multicolumn{2}{c}{Average}"
            in tex) and "Model & Paper & Ours & Paper & Ours & Paper & Ours" in tex
    assert (r"Softmax & $99.46 \pm 0.27$ & $99.35 \pm 0.21$ & $98.75 \pm 1.25$ & $\mathbf{97.50 \pm 0.71}$ & "
            in tex)
    assert r"Attention-BN & $99.55 \pm 0.31$ & $99.50 \pm 0.14$ & $99.38 \pm 1.08$ & $92.50 \pm 0.71$ &" in tex
    caption = tex.split(r"\caption{")[1].split("}\n")[0]
    assert "(10 sets)" not in caption and "(2 datasets)" in caption and "Welch's t-test" in caption
    with pytest.raises(SystemExit) as e:
        main(["report", EXP, "--records", str(workdir / "runs.csv"), "--format", "pdf"])
    assert e.value.code == 2


def test_the_sweep_line_names_every_command_that_made_the_records(workdir, monkeypatch):
    """Records made by a sweep, then its rerun with more seeds: the report prints both commands,
    each runnable as printed, not one rebuilt without the seeds and the launcher."""
    first = "attnbench sweep experiment=primal_dual/table1 seed=0 hydra/launcher=joblib_cpu trainer.max_epochs=100"
    second = first.replace("seed=0", "seed=0,1")
    for s, command in ((0, first), (1, second)):
        for m in ("softmax", "attention_bn"):
            append_record(workdir / "runs.csv", rec("JapaneseVowels", m, s, 99.0 + s, command=command))
    monkeypatch.setenv("ATTNBENCH_MADE_BY", "make reproduce-table1 ARGS='seed=0,1 trainer.max_epochs=100'")
    main(["report", EXP, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    (line,) = [x for x in (workdir / "rep" / EXP).with_suffix(".md").read_text().splitlines() if x.startswith("- sweep:")]
    assert line.startswith(f"- sweep: `{first}`, then `{second}`; report: `attnbench report {EXP} ")
    assert line.endswith("; made by `make reproduce-table1 ARGS='seed=0,1 trainer.max_epochs=100'`")


MAKE_VARIABLES = ("DATASETS", "STEPS", "JOBS", "LAUNCHER", "ARGS", "RECORDS")  # mk/reproduce.mk's


def test_make_says_every_variable_it_was_given_so_the_made_by_line_reruns_the_same_sweep():
    """mk/reproduce.mk's "made by" line (ATTNBENCH_MADE_BY), run as printed, runs the same sweep:
    ARGS (the jobs' overrides), JOBS, RECORDS and the budget included, quoted where they hold a space."""
    import os
    import re
    import shlex
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[1]

    def recipe(*argv: str) -> tuple[str, str]:
        out = subprocess.run(["make", "-n", *argv], cwd=root, capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}).stdout
        made_by = re.search(r'ATTNBENCH_MADE_BY="([^"]*)"', out).group(1)
        sweep = next(line for line in out.split(";") if "attnbench sweep" in line)
        return made_by, sweep.split("||")[0].strip()

    made_by, sweep = recipe("reproduce-table1", "DATASETS=JapaneseVowels", "ARGS=seed=0 trainer.max_epochs=2",
                            "JOBS=1", "RECORDS=elsewhere")
    assert made_by == ("make reproduce-table1 DATASETS=JapaneseVowels STEPS=300 JOBS=1 RECORDS=elsewhere "
                       "ARGS='seed=0 trainer.max_epochs=2'")
    assert sweep.endswith("seed=0 trainer.max_epochs=2") and "hydra.launcher.n_jobs=1" in sweep
    assert recipe(*shlex.split(made_by)[1:]) == (made_by, sweep)
    assert recipe("reproduce-table1")[0] == "make reproduce-table1 STEPS=300"  # the defaults said once: the budget
