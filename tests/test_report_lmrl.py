"""Reports of the WikiText-103 and D4RL experiments: the metric's direction in the header, the
paper's time / memory columns as ratios to its baseline, and the supplement's s ablation matched by
the paper's `s` column."""
from __future__ import annotations

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import append_record


def record(experiment, task, dataset, model, seed, metric, value, higher, overrides="", **extra):
    row = {"experiment": experiment, "task": task, "dataset": dataset, "model": model, "seed": seed, "status": "ok",
           "protocol": "holdout", "variant_key": f"{dataset}-{model}-{overrides}", "job_key": f"{dataset}{model}{seed}{overrides}",
           "time": "2026-01-01T00:00:00", "epochs_run": 1, "params": 1000, "flops_forward": 2000,
           "peak_mem_train_bytes": 4000, "time_per_epoch_s": 0.5, "git_commit": "abc", "git_dirty": "false",
           "metric": metric, "higher_is_better": higher, f"test_{metric}": value,
           "overrides": f"experiment={experiment} task.dataset={dataset} model={model} seed={seed} {overrides}".strip()}
    row.update(extra)
    return row


def test_wikitext_report_shows_direction_and_the_papers_efficiency_ratios(workdir):
    exp = "primal_attention/wikitext103"
    for model, ppl, mem in (("softmax", 33.5, 4000), ("primal_plus", 31.5, 3800)):
        append_record(workdir / "runs.csv", record(exp, "lm", "wikitext103", model, 0, "perplexity", ppl, False,
                                                   peak_mem_train_bytes=mem))
    main(["report", exp, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "primal_attention" / "wikitext103.md").read_text()
    assert "metric: test_perplexity (lower is better)" in md
    assert "| time × | time × (paper) | mem × (paper) |" in md  # ours, then ours (the paper's), as ratios
    # paper: Transformer 33.0, 3108.4 s / 1K steps, 9.0 GB; Primal.+ 31.0, 3104.0 s, 8.9 GB
    assert "| wikitext103 | softmax | 1 | 33.50 | 33.00 [T7b] | +0.50 | within |" in md
    assert "| wikitext103 | primal_plus | 1 | 31.50 | 31.00 [T7b] | +0.50 | within | — | — | 1.00 | 1.00 | 0.95 | 1.00 | 1.00 (1.00) | 0.95 (0.99) |" in md


def d4rl_report(workdir, exp, cells) -> str:
    """Records of hopper-medium-v2, (model, overrides, value of seed 0, seeds) per cell; the report's Markdown."""
    for model, overrides, value, seeds in cells:
        for seed in range(seeds):
            append_record(workdir / "runs.csv", record(exp, "d4rl", "hopper-medium-v2", model, seed, "normalized_return",
                                                       value + seed, True, overrides))
    main(["report", exp, "--records", str(workdir / "runs.csv"), "--out", str(workdir / "rep")])
    return (workdir / "rep" / f"{exp}.md").read_text()


def test_d4rl_s_ablation_rows_match_the_supplements_s_column(workdir):
    md = d4rl_report(workdir, "primal_attention/d4rl_s", [("primal_plus", f"model.final_attention.low_rank={s}", v, 2)
                                                          for s, v in ((32, 66.0), (64, 64.0), (96, 74.0))])
    assert "metric: test_normalized_return (higher is better)" in md
    assert "| hopper-medium-v2 | primal_plus (low_rank=32) | 2 | 66.50 ± 0.71 | 66.70 [T2] |" in md
    assert "| hopper-medium-v2 | primal_plus (low_rank=64) | 2 | 64.50 ± 0.71 | 63.10 [T2] |" in md
    assert "| hopper-medium-v2 | primal_plus (low_rank=96) | 2 | 74.50 ± 0.71 | 73.80 [T2] |" in md


def test_d4rl_report_maps_dataset_names_to_the_papers(workdir):
    md = d4rl_report(workdir, "primal_attention/d4rl", [("softmax", "", 64.0, 3), ("primal_plus", "", 74.0, 3)])
    assert "| hopper-medium-v2 | softmax | 3 | 65.00 ± 1.00 | 64.20 ± 1.10 [T5] |" in md
    assert "| hopper-medium-v2 | primal_plus | 3 | 75.00 ± 1.00 | 74.50 ± 0.60 [T5] |" in md
