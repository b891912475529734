"""Every row of the Primal-Attention tables (main Tables 1, 3, 5, 7b; supplement Tables 1, 3, 4, 5)
and of the primal-dual Table 4 / Appendix C is a job of an experiment config, with the published
per-model settings, and its report maps it to the paper's row (results/paper/*.csv)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench_cli.config import compose
from bench_cli.commands import sweep
from bench_cli.results.report import experiment as experiment_report
from attnbench.models.attention import attention_spec

PAPER = Path(__file__).resolve().parents[1] / "results" / "paper"
LRA_TASKS = {"lra_listops": "listops", "lra_text": "imdb", "lra_retrieval": "aan", "lra_image": "cifar10",
             "lra_pathfinder": "pathfinder32"}


def paper_rows(file: str, table: str, metric: str | None = None) -> list[dict]:
    with open(PAPER / file, newline="") as f:
        return [r for r in csv.DictReader(f) if r["table"] == table and r["dataset"] != "Average"
                and (metric is None or r["metric"] == metric)]


def axes(experiment: str) -> dict[str, list[str]]:
    """The values of each swept key of an experiment's grid (nothing composed but the multirun config)."""
    found: dict[str, list[str]] = {}
    for job in sweep.expand_grid([f"experiment={experiment}", "seed=0"]):
        for o in job:
            key, _, value = o.partition("=")
            found.setdefault(key, [])
            if value not in found[key]:
                found[key].append(value)
    return found


def paper_name(experiment: str):
    report = compose.compose([f"experiment={experiment}"]).report
    names = dict(report.get("paper_models") or {})
    return lambda model: names.get(model, model)


# --- the model axes are the tables' rows ------------------------------------------------------------
@pytest.mark.parametrize("experiment,file,table", [
    ("primal_attention/uea", "primal_attention_main.csv", "1"),
    ("primal_attention/lra", "primal_attention_main.csv", "3"),
    ("primal_attention/lra_listops_cpu", "primal_attention_main.csv", "3"),
    ("primal_attention/d4rl", "primal_attention_main.csv", "5"),
    ("primal_attention/wikitext103", "primal_attention_main.csv", "7b"),
    ("primal_dual/table4", "primal_dual_2023.csv", "4"),
    ("primal_dual/table4_listops_cpu", "primal_dual_2023.csv", "4"),
    ("primal_dual/appc_retrieval", "primal_dual_2023.csv", "text:AppC"),
])
def test_model_axis_is_every_row_of_the_papers_table(experiment, file, table):
    name = paper_name(experiment)
    models = axes(experiment)["model"]
    assert len(models) == len(set(models))
    expected = {r["model"] for r in paper_rows(file, table)}
    if table == "text:AppC":  # Sparse-SH is "comparable" in the prose, with no number
        expected.add("sparse_sh")
    assert {name(m) for m in models} == expected


def test_causal_tables_run_only_causal_attentions():
    for experiment in ("primal_attention/d4rl", "primal_attention/wikitext103"):
        for model in axes(experiment)["model"]:
            preset = compose.load_option("model", model)
            names = [preset.attention.name] + ([preset.final_attention.name] if preset.get("final_attention") else [])
            assert all(attention_spec(n).capabilities.causal for n in names), (experiment, model)


def test_ablation_grids_are_the_supplements():
    grid = axes("primal_attention/supp_table1")
    rows = paper_rows("primal_attention_supp.csv", "1")
    assert grid["model"] == ["primalformer"]
    assert {float(s) for s in grid["model.attention.low_rank"]} == {float(r["s"]) for r in rows}
    assert {float(e) for e in grid["model.eta"]} == {float(r["eta"]) for r in rows}
    assert len(grid["task.dataset"]) == len({r["dataset"] for r in rows}) == 10
    for experiment in ("primal_attention/supp_table3", "primal_attention/supp_table4"):
        grid = axes(experiment)
        assert grid["model"] == ["primal_plus"] and [v.lower() for v in grid["model.final_attention.data_dependent"]] == ["true", "false"]
    assert set(axes("primal_attention/supp_table4")["task"]) == set(LRA_TASKS)


# --- the published per-model settings ---------------------------------------------------------------
def test_baselines_take_their_codes_settings_per_family():
    lra = {(task, model): compose.compose(["experiment=primal_attention/lra", f"task={task}", f"model={model}"])
           for task, model in (("lra_listops", "softmax"), ("lra_listops", "reformer"), ("lra_listops", "yoso_e"),
                               ("lra_text", "yoso_e"), ("lra_listops", "linformer"))}
    lra = {(cfg.task.dataset, cfg.model.name): cfg for cfg in lra.values()}
    # the LRA code's attention_dropout reaches softmax, not Reformer (LSHSelfAttention 0.0) nor YOSO-E
    assert lra[("listops", "softmax")].task.backbone.attention_dropout == 0.1
    assert lra[("listops", "reformer")].task.backbone.attention_dropout is None
    assert lra[("imdb", "yoso_e")].task.backbone.attention_dropout is None
    # YOSO-E's tau per task (mlpen/YOSO yoso-v1-32 config), LRA presets as lra_config.py
    assert (lra[("listops", "yoso_e")].model.attention.hash_code_len, lra[("imdb", "yoso_e")].model.attention.hash_code_len) == (11, 12)
    assert lra[("listops", "linformer")].model.attention.linformer_k == 256
    assert lra[("listops", "reformer")].model.attention.num_hashes == 2
    # Flow-Attention per family (thuml/Flowformer): RL clamp 10 + output dropout, NLP clamp 5, UEA none
    flow = {}
    for experiment, dataset in (("primal_attention/d4rl", "hopper-medium-v2"), ("primal_attention/wikitext103", "wikitext103"),
                                ("primal_attention/uea", "JapaneseVowels")):
        cfg = compose.compose([f"experiment={experiment}", "model=flowformer", f"task.dataset={dataset}"])
        flow[cfg.task.name] = OmegaConf.to_container(cfg.model.attention, resolve=True)
    assert (flow["d4rl"]["source_clamp"], flow["d4rl"]["output_dropout"]) == (10, True)
    assert (flow["lm"]["source_clamp"], flow["lm"]["output_dropout"]) == (5, False)
    assert (flow["uea"]["source_clamp"], flow["uea"]["feature_map"]) == (None, "sigmoid")


@pytest.mark.parametrize("family,experiment,one", [
    ("UEA", "primal_attention/uea", "task.dataset=JapaneseVowels"), ("LRA", "primal_attention/lra", "task=lra_listops"),
    ("D4RL", "primal_attention/d4rl", "task.dataset=hopper-medium-v2"),
    ("WikiText-103", "primal_attention/wikitext103", "task.dataset=wikitext103"),
    ("ImageNet", "primal_attention/imagenet", "task.dataset=imagenet")])
def test_primal_plus_architecture_is_supplement_table5(family, experiment, one):
    """Supplement Table 5 (which layers are Primal): canonical_layer+[primal_layer], heads, head dim."""
    want = {r["metric"]: int(float(r["value"])) for r in paper_rows("primal_attention_supp.csv", "5") if r["dataset"] == family}
    cfg = compose.compose([f"experiment={experiment}", "model=primal_plus", one])
    b = cfg.task.backbone
    assert cfg.model.attention.name == "softmax" and cfg.model.final_attention.name == "primal"
    assert (b.n_layers - 1, 1, b.n_heads, b.d_model // b.n_heads) == (
        want["canonical_layers"], want["primal_layers"], want["num_heads"], want["head_dim"])


# --- the reports map every paper row ----------------------------------------------------------------
def record(experiment: str, dataset: str, model: str, values: tuple = (), keys: tuple = ()) -> dict:
    overrides = " ".join([f"experiment={experiment} task.dataset={dataset} model={model} seed=0",
                          *(f"{k}={v}" for k, v in zip(keys, values))])
    return {"experiment": experiment, "task": "t", "dataset": dataset, "model": model, "seed": "0", "status": "ok",
            "protocol": "paper", "variant_key": f"{dataset}-{model}-{values}", "job_key": f"{dataset}{model}{values}",
            "time": "2026-01-01T00:00:00", "test_accuracy": "50.0", "overrides": overrides}


def mapped_paper_rows(experiment: str, datasets: list[str], values: list | None = None) -> set[tuple]:
    """(table, metric, paper model, rows_by value(s), paper value) of every paper row the report finds
    for its rows and datasets; ``values``: of the rows_by key (one key) or tuples (several keys)."""
    cfg = compose.compose_unchecked([f"experiment={experiment}"], with_hydra=True)
    rows_by = OmegaConf.to_container(cfg.report.rows_by) if cfg.report.get("rows_by") else []
    keys = tuple(by["key"] for by in (rows_by if isinstance(rows_by, list) else [rows_by]))
    combos = [v if isinstance(v, tuple) else (v,) for v in values] if values else [()]
    models = axes(experiment)["model"]
    rows = [record(experiment, d, m, v, keys) for d in datasets for m in models for v in combos]
    report = experiment_report.build(experiment, cfg, Path("records.csv"), rows, rows, show_all=True)
    found = set()
    for column in (report.layout.headline, *report.layout.own):
        paper_of, _ = report.paper_lookup(column)
        for d in report.datasets:
            for label in report.rows.labels:
                spec = report.rows.by_label[label]
                p = paper_of(d, label)
                if p is not None:
                    value = spec.values[0] if len(spec.values) == 1 else spec.values or None
                    found.add((p.table, column.paper_metric, report.paper_model(label), value, p.mean))
    return found


def expected_rows(file: str, table: str, metrics: set[str], by=None) -> set[tuple]:
    return {(table, r["metric"], r["model"], by(r) if by else None, float(r["value"]))
            for r in paper_rows(file, table) if r["metric"] in metrics}


def test_reports_map_every_row_of_the_main_tables():
    uea = sorted({r["dataset"] for r in paper_rows("primal_attention_main.csv", "1")})
    assert mapped_paper_rows("primal_attention/uea", uea) == expected_rows("primal_attention_main.csv", "1", {"accuracy"})
    assert mapped_paper_rows("primal_attention/lra", list(LRA_TASKS.values())) == expected_rows(
        "primal_attention_main.csv", "3", {"accuracy"})
    d4rl = axes("primal_attention/d4rl")["task.dataset"]
    assert mapped_paper_rows("primal_attention/d4rl", d4rl) == expected_rows("primal_attention_main.csv", "5", {"reward"})
    # Table 7b: perplexity in its own table, time and memory as ratios beside it
    assert mapped_paper_rows("primal_attention/wikitext103", ["wikitext103"]) == expected_rows(
        "primal_attention_main.csv", "7b", {"perplexity"})


def test_reports_map_the_ablation_and_diversity_rows():
    grid = axes("primal_attention/supp_table1")   # a row per (s, eta): rows_by with two keys
    s_eta = [(s, eta) for s in grid["model.attention.low_rank"] for eta in grid["model.eta"]]
    number = lambda v: str(float(v))  # noqa: E731  (the grid's 0.0 is the CSV's 0)
    found = mapped_paper_rows("primal_attention/supp_table1", grid["task.dataset"], s_eta)
    assert {(*r[:3], tuple(map(number, r[3])), r[4]) for r in found} == expected_rows(
        "primal_attention_supp.csv", "1", {"accuracy"}, lambda r: (number(r["s"]), number(r["eta"])))
    notes = lambda r: "true" if r["notes"].split("= ")[1].startswith("yes") else "false"  # noqa: E731
    uea = sorted({r["dataset"] for r in paper_rows("primal_attention_supp.csv", "3")})
    assert mapped_paper_rows("primal_attention/supp_table3", uea, ["true", "false"]) == expected_rows(
        "primal_attention_supp.csv", "3", {"accuracy"}, notes)
    assert mapped_paper_rows("primal_attention/supp_table4", list(LRA_TASKS.values()), ["true", "false"]) == expected_rows(
        "primal_attention_supp.csv", "4", {"accuracy"}, notes)
    diversity = {"head_l2_distance_mean", "head_l2_distance_std"}
    assert mapped_paper_rows("primal_dual/table4", ["aan"]) == expected_rows("primal_dual_2023.csv", "4", diversity)
    assert mapped_paper_rows("primal_dual/appc_retrieval", ["aan"]) == expected_rows(
        "primal_dual_2023.csv", "text:AppC", {"accuracy"})
