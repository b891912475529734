"""`attnbench report zoo/offline`: the attention zoo, every model preset on every offline
task of the experiment, as a leaderboard per task.

The zoo's grid is (case x model x seed): a case is one option of the experiment's case group
(``report.case_axis``, e.g. ``experiment/zoo/_case``: one (task, dataset) pair and its budget), the
models are the experiment's model axis (``glob(*)``: every preset of the model group, so a new
preset joins the zoo). A (task, model) pair the registry's capabilities refuse is not run: the
sweep leaves it out (``sweep.skip_incapable``, bench_cli/commands/sweep/checks.py) and the report names it with the
same refusal (config.taskfit.check_model_fits_task). Built-in attentions that no preset names are listed too.

Per case, one table: the test metric's mean ± std over the seeds, and the training time, peak
training memory and training FLOPs per sample as ratios to the baseline (softmax) on that case; one
plot (bench_cli.results.plots.zoo_figure: metric against training time, mean ± std over the seeds,
marker area by memory, the LRA paper's Figure 3 form; PNG and PDF). Then the `attnbench profile`
ratios at the LRA lengths (``report.profile_csv``), the same for every task: they do not depend on
the data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from bench_cli.config import compose
from bench_cli.results.job_records import one_row_per_job
from bench_cli.results.provenance import PROJECT_ROOT
from bench_cli.core.spread import interval_text
from bench_cli.results.report import render, select
from bench_cli.results.report.paper import number
from bench_cli.core.ui import DASH, fixed, mean_pm
from bench_cli.core.files import write_atomically

PROFILE_LENGTHS = (1024, 2048, 4096)   # the LRA lengths of the profile table (make reproduce-zoo)
RATIOS = (("time ×", "train_time_s"), ("memory ×", "peak_mem_train_bytes"), ("FLOPs ×", "flops_train_step"))


@dataclass
class Case:
    """One (task, dataset) of the zoo with its budget, and the models its task cannot run."""
    name: str
    task: str
    dataset: str
    budget: str
    skipped: dict[str, str] = field(default_factory=dict)   # model -> the registry's refusal
    title: str = ""           # the plot's title (report.case_title): the task as a reader of a paper names it

    @property
    def label(self) -> str:
        return f"{self.task}/{self.dataset}"


@dataclass
class ZooPlan:
    cases: list[Case]
    models: list[str]
    unpreset: list[str]       # built-in attentions no model preset names (cannot be selected with model=)

    def jobs(self, seeds=(0,)) -> list[tuple[str, str, int]]:
        """(case, model, seed) of every job the sweep runs: the incapable pairs left out."""
        return [(c.name, m, s) for c in self.cases for m in self.models if m not in c.skipped for s in seeds]


def sweep_axis(cfg, key: str) -> list[str]:
    """The values of a sweep axis of the experiment (``hydra.sweeper.params``); ``glob(*)`` on the
    model group is every option of it, as Hydra's glob expands it."""
    value = str(OmegaConf.select(cfg, f"hydra.sweeper.params.{key}", default="") or "")
    if key == "model" and value.replace(" ", "") == "glob(*)":
        return compose.group_options("model")
    return [v.strip() for v in value.split(",") if v.strip()]


def _case_axis(cfg) -> str:
    axis = OmegaConf.select(cfg, "report.case_axis", default=None)
    if not axis:
        from bench_cli.core.errors import UserError

        raise UserError("a zoo experiment names its case group in report.case_axis (conf/experiment/zoo/_budget.yaml)")
    return str(axis)


def refusals(case_cfg, models: list[str]) -> dict[str, str]:
    """model -> why the case's task cannot run it: the sweep's check (config.taskfit.check_model_fits_task)
    on each model preset, without composing a job per model."""
    from bench_cli.core.errors import UserError
    from bench_cli.config.taskfit import build_task, check_model_fits_task

    task, out = build_task(case_cfg), {}
    for model in models:
        probe = OmegaConf.create({"task": {"name": str(case_cfg.task.name)}})
        probe.model = compose.load_option("model", model)
        try:
            check_model_fits_task(task, probe)
        except UserError as e:
            out[model] = str(e)
    return out


def presetless_attentions(models: list[str]) -> list[str]:
    """Built-in registry attentions that no model preset of the zoo names (in any role)."""
    from bench_cli.config import catalog

    named = set()
    for model in models:
        preset = compose.option_data("model", model)
        named |= {(preset.get(role) or {}).get("name") for role in ("attention", "final_attention", "cross_attention")}
    from bench_cli.core.registry import is_builtin

    return sorted(name for name, a in catalog.attentions().items() if name not in named and is_builtin(a["owner"]))


def zoo_plan(name: str, overrides: list[str] = ()) -> tuple[ZooPlan, object]:
    """The zoo's cases (each composed once), models and refused pairs; and the experiment's config."""
    cfg = compose.compose_unchecked([f"experiment={name}", *overrides], with_hydra=True)
    axis, models = _case_axis(cfg), sweep_axis(cfg, "model")
    cases = []
    with compose.composer() as compose_one:
        for option in sweep_axis(cfg, axis):
            case_cfg = compose_one([f"experiment={name}", f"{axis}={option}", *overrides])
            cases.append(Case(option, str(case_cfg.task.name), str(case_cfg.task.get("dataset", "")),
                              str(OmegaConf.select(case_cfg, "report.budget", default="") or ""),
                              refusals(case_cfg, models),
                              str(OmegaConf.select(case_cfg, "report.case_title", default="") or "")))
    return ZooPlan(cases, models, presetless_attentions(models)), cfg


# --- the tables -----------------------------------------------------------------------------------
@dataclass
class Entry:
    """One attention's row on one case: the metric over seeds and the efficiency ratios."""
    model: str
    cell: select.Cell | None
    ratios: dict[str, float | None]
    means: dict[str, float | None]    # the absolute means behind the ratios (the plot's axes)
    time_sd: float | None = None      # the training time's std over seeds (the plot's error bar)
    noisy: int = 0                    # runs behind the time ratio (its and the baseline's) flagged timing_noisy


def rows_of(case: Case, rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("task") == case.task and r.get("dataset") == case.dataset]


def case_entries(case: Case, rows: list[dict], models: list[str], baseline: str) -> list[Entry]:
    """Every model with records on the case, best metric first (models without an ok run last)."""
    mine = rows_of(case, rows)
    cells = select.aggregate(mine, "test_score")
    base = cells.get((case.dataset, baseline))
    entries = []
    for model in dict.fromkeys([*models, *sorted({r.get("model", "") for r in mine})]):
        cell = cells.get((case.dataset, model))
        if cell is None:
            continue
        means = {col: select.column_mean(cell, col) for _, col in RATIOS}
        ratios = {col: _ratio(means[col], select.column_mean(base, col)) for _, col in RATIOS}
        entries.append(Entry(model, cell, ratios, means, select.column_std(cell, "train_time_s"),
                             select.noisy_count(cell) + select.noisy_count(base)))
    higher = _higher_is_better(mine)
    return sorted(entries, key=lambda e: (e.cell.mean is None, -(e.cell.mean or 0) if higher else (e.cell.mean or 0)))


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _higher_is_better(rows: list[dict]) -> bool:
    return not any(str(r.get("higher_is_better", "")).lower() == "false" for r in rows)


def metric_name(rows: list[dict], case: Case) -> str:
    names = sorted({r.get("metric", "") for r in rows if r.get("dataset") == case.dataset} - {""})
    name = names[0] if names else "metric"
    return f"{name} (%)" if name == "accuracy" else name


ACRONYMS = ("rmse", "mse", "mae", "bleu", "auc")  # metric names written in capitals on a plot


def zoo_figure_content(case: Case, entries: list[Entry], metric: str, higher: bool) -> dict:
    """The arguments of plots.zoo_figure for a case: every attention with an ok run, best first (its
    number in the plot is its rank), mean ± std over the seeds on both axes."""
    from bench_cli.results.plots import ZooPoint

    ok = [e for e in entries if e.cell.mean is not None]
    name, _, unit = metric.partition(" (")
    metric = (name.upper() if name in ACRONYMS else name) + (f" ({unit}" if unit else "")
    seeds = max((e.cell.n for e in ok), default=0)
    return {"points": [ZooPoint(e.model, e.cell.mean, e.means["train_time_s"], e.means["peak_mem_train_bytes"],
                                e.time_sd, e.cell.std) for e in ok],
            "title": f"Attention zoo, {case.title or case.label}: test {metric.partition(' (')[0]} vs training time",
            "metric": f"test {metric}, {'higher' if higher else 'lower'} is better",
            "subtitle": f"mean ± std over {'up to ' if any(e.cell.n < seeds for e in ok) else ''}{seeds} seeds, "
                        "reduced budget"}


def case_table(entries: list[Entry]) -> list[list[str]]:
    out = []
    for e in entries:
        n = str(e.cell.n) + (f" ({len(e.cell.failed)} failed)" if e.cell.failed else "")
        out.append([e.model, n, mean_pm(e.cell.mean, e.cell.std),
                    *(fixed(e.ratios[c]) + (" noisy" if c == "train_time_s" and e.noisy else "") for _, c in RATIOS)])
    return out


def profile_ratios(path: Path | None) -> dict[str, dict[int, dict]]:
    """model -> seq_len -> the profile row (its newest ok or failed row)."""
    from bench_cli.results.csv_store import read_records

    out: dict[str, dict[int, dict]] = {}
    for r in read_records(path) if path and path.is_file() else []:
        length = number(r.get("seq_len"))
        if length is not None:
            out.setdefault(str(r.get("model")), {})[int(length)] = r
    return out


def _profile_cell(row: dict | None, column: str) -> str:
    if row is None:
        return DASH
    if row.get("model_status", "ok") not in ("ok", ""):
        return str(row["model_status"])
    if column.startswith("time"):  # the rounds' median ratio [their IQR], and the flag of a busy machine
        return interval_text(row, f"ratio_{column}") + (" noisy" if row.get("timing_noisy") else "")
    return fixed(number(row.get(f"ratio_{column}")))


def profile_table(models: list[str], profile: dict, baseline: str) -> list[list[str]]:
    rows = []
    if not profile:
        return rows
    for model in models:
        by_len = profile.get(model, {})
        if model == baseline:
            rows.append([model, *("1.00" for _ in range(2 * len(PROFILE_LENGTHS)))])
        elif by_len:
            rows.append([model, *(_profile_cell(by_len.get(n), "time_train_s") for n in PROFILE_LENGTHS),
                         *(_profile_cell(by_len.get(n), "peak_mem_train_bytes") for n in PROFILE_LENGTHS)])
    return rows


def profile_headers() -> list[str]:
    return ["attention", *(f"time× {n // 1024}K" for n in PROFILE_LENGTHS), *(f"mem× {n // 1024}K" for n in PROFILE_LENGTHS)]


# --- the report -----------------------------------------------------------------------------------
def header_lines(plan: ZooPlan, cfg, rows: list[dict], path: Path, profile_path: Path | None) -> list[str]:
    from bench_cli.results.report.common import commands_text, made_by, records_line, wall_clock

    seeds = sorted({str(r.get("seed")) for r in rows}, key=lambda s: (len(s), s))
    baseline = str(cfg.report.get("baseline") or "softmax")
    lines = [f"{len(plan.models)} model presets x {len(plan.cases)} cases x {len(seeds)} seeds "
             f"({', '.join(seeds) or DASH}); protocol: {', '.join(sorted({r.get('protocol', '') for r in rows}))}",
             *(f"budget {c.label}: {c.budget}" for c in plan.cases),
             f"ratios: to {baseline} on the same case: training time (train_time_s), peak training memory "
             "(peak_mem_train_bytes), training FLOPs per sample (flops_train_step); one torch thread per job",
             records_line(path, rows)]
    span = wall_clock(rows)
    if span:
        lines.append(f"cost: {span}")
    if profile_path:
        lines.append(f"profile: {profile_path} (`attnbench profile` on synthetic LRA ListOps batches)")
    name = str(OmegaConf.select(cfg, "experiment_name", default="zoo"))
    sweep = commands_text(rows, f"attnbench sweep experiment={name}")
    return lines + [f"sweep: {sweep}; report: `attnbench report {name} --records {path}`" + made_by()]


def skipped_notes(plan: ZooPlan, rows: list[dict]) -> list[str]:
    """The pairs the zoo does not run and why; the attentions no preset selects; failed runs."""
    out = [f"Not run on {c.label}: {reason}." for c in plan.cases for reason in dict.fromkeys(c.skipped.values())]
    if plan.unpreset:
        out.append(f"Registered attentions without a model preset (conf/model/<name>.yaml), so not in the zoo: "
                   f"{', '.join(plan.unpreset)}.")
    failed = [r for r in rows if r.get("status") not in ("ok", None, "")]
    for reason in dict.fromkeys(f"{r.get('dataset')}/{r.get('model')}: {r.get('status')} "
                                f"({str(r.get('error', ''))[:120]})" for r in failed):
        out.append(f"Failed run: {reason}.")
    return out


@dataclass
class Section:
    case: Case
    metric: str
    entries: list[Entry]
    plot: Path | None


def identical_notes(sections: list[Section]) -> list[str]:
    """Presets whose runs agree on every seed in metric and test loss: the same model at the zoo's
    settings (e.g. Primal.+ and PrimalFormer in a 1-layer encoder), named so a reader does not take
    the tie for a finding."""
    found: dict[tuple[str, ...], list[str]] = {}
    for s in sections:
        by_result: dict[tuple, list[str]] = {}
        for e in s.entries:
            if e.cell.n >= 2:
                key = tuple(sorted((str(r.get("seed")), str(r.get("test_score")), str(r.get("test_loss")))
                                   for r in e.cell.rows))
                by_result.setdefault(key, []).append(e.model)
        for models in by_result.values():
            if len(models) > 1:
                found.setdefault(tuple(sorted(models)), []).append(s.case.label)
    return [f"The same results on every seed (metric and test loss), so the same model here: {' = '.join(models)} "
            f"on {', '.join(cases)}." for models, cases in found.items()]


def write_zoo_report(name: str, cfg, path: Path, rows: list[dict], opts: dict, overrides: list[str]) -> None:
    """Build, print and write ``<out>/zoo.md`` and one ``<out>/<task>_<dataset>.png`` per case."""
    from bench_cli.results import plots
    from bench_cli.core.ui import console, show_table

    plan, cfg = zoo_plan(name, overrides)
    rows, duplicates = one_row_per_job(rows)
    baseline = str(cfg.report.get("baseline") or "softmax")
    # The config's folders are the project's (a relative one is read from the project root, not the
    # working folder); the header names the profile as the config does.
    out_dir = Path(opts.get("out")
                   or (PROJECT_ROOT / str(cfg.report.out) if cfg.report.get("out") else path.parent))
    profile_path = Path(str(cfg.report.profile_csv)) if cfg.report.get("profile_csv") else None
    sections = []
    for case in plan.cases:
        entries = case_entries(case, rows, plan.models, baseline)
        metric = metric_name(rows, case)
        png = out_dir / f"{case.task}_{case.dataset}.png" if entries and opts.get("write", True) else None
        if png:
            higher = _higher_is_better(rows_of(case, rows))
            plots.zoo_figure(path=png, **zoo_figure_content(case, entries, metric, higher))
        sections.append(Section(case, metric, entries, png))
    profile = profile_table(plan.models, profile_ratios(profile_path and PROJECT_ROOT / profile_path), baseline)
    title = str(cfg.report.get("title") or name)
    header = header_lines(plan, cfg, rows, path, profile_path)
    notes = skipped_notes(plan, rows) + identical_notes(sections) + select.duplicates_note(duplicates)
    screen = render.sized(console, opts.get("width"))
    render.print_lines(screen, [title, *header])
    for s in sections:
        if s.entries:
            show_table(s.case.label, case_headers(s.metric), case_table(s.entries), out=screen)
        else:
            render.print_lines(screen, [f"{s.case.label}: no records"])
    if profile:
        show_table("profile at the LRA lengths (ratios to softmax)", profile_headers(), profile, out=screen)
    render.print_lines(screen, notes)
    if opts.get("write", True):
        out_dir.mkdir(parents=True, exist_ok=True)
        md = out_dir / "zoo.md"
        write_atomically(md, markdown(title, header, sections, profile, notes, out_dir))
        render.print_lines(screen, [f"wrote {md}" + "".join(f", {s.plot}" for s in sections if s.plot)])


def case_headers(metric: str) -> list[str]:
    return ["attention", "n", metric, *(label for label, _ in RATIOS)]


def markdown(title: str, header: list[str], sections: list[Section], profile: list[list[str]], notes: list[str],
             out_dir: Path) -> str:
    """The report: the header, a table and a plot link per case, the profile table, the notes. Lines
    of prose are wrapped at 80 columns (render.wrapped); tables are kept to a few narrow columns."""
    lines = [f"# {title}", ""]
    lines += [part for h in header for part in render.wrapped(f"- {h}", 80)]
    for s in sections:
        lines += ["", f"## {s.case.label}", ""]
        lines += render.markdown_table(case_table(s.entries), case_headers(s.metric)) if s.entries else ["No records."]
        if s.plot:
            from bench_cli.results.plots import vector_path

            png = s.plot.relative_to(out_dir)
            lines += ["", f"![{s.case.label}]({png})", "", f"[vector PDF]({vector_path(png)})"]
    if profile:
        lines += ["", "## Profile at the LRA lengths", "",
                  *render.wrapped("Training-step time and peak training memory as ratios to softmax on one "
                                  "synthetic ListOps batch (the LRA encoder: 2 layers, d_model 64), the same "
                                  "for every task above.", 80), "",
                  *render.markdown_table(profile, profile_headers())]
    if notes:
        lines += ["", *(part for n in notes for part in render.wrapped(f"- {n}", 80))]  # one item per note
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # `python -m bench_cli.results.report.zoo models`: the zoo's models for `attnbench profile`
    import sys

    if sys.argv[1:] != ["models"]:
        raise SystemExit("usage: python -m bench_cli.results.report.zoo models")
    zoo_cfg = compose.compose_unchecked(["experiment=zoo/offline"], with_hydra=True)
    print("[" + ",".join(m for m in sweep_axis(zoo_cfg, "model") if m != zoo_cfg.report.baseline) + "]")
