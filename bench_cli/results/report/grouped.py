"""`attnbench report [--records FILE]` without an experiment: every run of a records file, grouped
by the swept axes -- the identity columns (experiment, task, dataset, model, protocol) and the
overrides whose values differ between rows, the seed aside -- with each group's mean and sample
standard deviation over seeds of the test score (``test_score``; ``test_accuracy`` for records
older than that column). The cells are the experiment report's (select.aggregate): per seed the
latest ok record, older variants of a group ignored, each job_key counted once. Writes
``<out>/<records file name>.md`` + ``.csv``."""
from __future__ import annotations

from pathlib import Path

from bench_cli.config import compose
from bench_cli.results import code_identity, csv_store
from bench_cli.results.job_keys import NON_SEMANTIC, NON_SEMANTIC_KEYS
from bench_cli.results.job_records import one_row_per_job
from bench_cli.core.errors import UserError
from bench_cli.core.spread import NOISY_NOTE
from bench_cli.results.report import confirmed, latex, paired, render, select, trials
from bench_cli.results.report.common import direction_note, made_by, overrides_of, records_line, rerun_command, wall_clock
from bench_cli.core.ui import DASH, csv_value, fixed, mean_pm
from bench_cli.core.files import write_atomically

SCORE = "test_score"
IDENTITY = ("experiment", "task", "dataset", "model", "protocol")
# Overrides shown under an identity column's name, or averaged over (the seed).
NOT_AXES = {"experiment", "task", "task.dataset", "model", "protocol", "seed"}
# Config groups that do not change a result (job_keys.semantic_config leaves them out of job keys):
# a moved results file or another data root is not a swept axis.
NOT_RESULTS = (*NON_SEMANTIC, "measure", *NON_SEMANTIC_KEYS)
UNSET = "(default)"   # an override a row was not given


def is_axis_key(key: str) -> bool:
    return key not in NOT_AXES and not any(key == g or key.startswith(g + ".") for g in NOT_RESULTS)


def axes(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(axes: the identity columns and override keys whose values differ between rows, in that
    order, overrides in first-seen order; the shared settings: 'column value' and 'key=value')."""
    given = [overrides_of(r) for r in rows]
    keys = list(dict.fromkeys(k for o in given for k in o if is_axis_key(k)))
    varying, shared = [], []
    for name, values, shown in ([(c, {r.get(c) or "" for r in rows}, "{} {}") for c in IDENTITY]
                                + [(k, {o.get(k, UNSET) for o in given}, "{}={}") for k in keys]):
        if len(values) > 1:
            varying.append(name)
        elif values != {""}:
            shared.append(shown.format(name, *values))
    return varying, shared


def axis_value(row: dict, axis: str) -> str:
    return (row.get(axis) or DASH) if axis in IDENTITY else overrides_of(row).get(axis, UNSET)


def label_of(axis_names: list[str]):
    """A record's group label (its axis values) for select.aggregate; the dataset is its own key."""
    return lambda r: "\x1f".join(axis_value(r, a) for a in axis_names)


def metric_name(rows: list[dict]) -> str:
    """'accuracy', 'rmse', ...: the records' ``metric`` (accuracy before the column existed)."""
    names = sorted({r.get("metric") or "accuracy" for r in rows})
    return names[0] if len(names) == 1 else "score (" + ", ".join(names) + ")"


def group_rows(cells: dict, axis_names: list[str]) -> list[dict]:
    """One row per group (first-seen order): its axis values, seeds and the score's mean and std."""
    out = []
    for (_, label), cell in cells.items():
        values = dict(zip(axis_names, label.split("\x1f"))) if axis_names else {}
        out.append({**values, "n": cell.n, "n_failed": len(cell.failed),
                    "seeds": " ".join(sorted(cell.values, key=lambda s: (len(s), s))),
                    "epochs": "/".join(str(e) for e in sorted(cell.epochs)), "mean": cell.mean, "std": cell.std,
                    "params": select.column_mean(cell, "params"),
                    "time_per_epoch_s": select.column_mean(cell, "time_per_epoch_s"),
                    "time_per_epoch_s_std": select.column_std(cell, "time_per_epoch_s"),
                    "timing_noisy": select.noisy_count(cell)})
    return out


def display(rows: list[dict], axis_names: list[str]) -> list[list[str]]:
    return [[*(r[a] for a in axis_names), str(r["n"]) + (f" ({r['n_failed']} failed)" if r["n_failed"] else ""),
             mean_pm(r["mean"], r["std"]), r["epochs"] or DASH, fixed(r["params"], 0),
             mean_pm(r["time_per_epoch_s"], r["time_per_epoch_s_std"]) + (" noisy" if r["timing_noisy"] else "")]
            for r in rows]


def header(path: Path, used: list[dict], axis_names: list[str], shared: list[str], command: str) -> list[str]:
    seeds = sorted({r.get("seed") for r in used}, key=lambda x: (len(str(x)), str(x)))
    commands = sorted({r.get("command") for r in used} - {None, ""})
    span = wall_clock(used)
    return [
        f"grouped by: {', '.join(axis_names) or 'nothing (no column differs between the rows but the seed)'}; "
        f"mean ± sample std over seeds ({len(seeds)}: {', '.join(map(str, seeds))}), the score's and the "
        "time per epoch's (each run's: its median epoch)",
        f"metric: {SCORE} = test {metric_name(used)}{direction_note(used, {})}",
        *([f"same in every row: {', '.join(shared)}"] if shared else []),
        records_line(path, used),
        *([f"wall clock: {span}"] if span else []),
        f"sweep{'s' if len(commands) > 1 else ''}: {'; '.join(f'`{c}`' for c in commands) or DASH}; "
        f"report: `{command}`" + made_by(),
    ]


def notes(cells: dict, dropped: int) -> list[str]:
    ignored = sum(c.ignored for c in cells.values())
    gaps = sum(1 for c in cells.values() if not c.n)
    noisy = sum(select.noisy_count(c) for c in cells.values())
    return (select.duplicates_note(dropped)
            + ([f"{NOISY_NOTE}: {noisy} run(s) were timed while the load exceeded the cores or their epochs' times "
                "spread widely (record column timing_noisy); their groups' time/epoch says noisy."] if noisy else [])
            + ([f"{ignored} older records of other configurations of the same groups were ignored "
                "(newest variant shown)."] if ignored else [])
            + ([f"{gaps} group(s) without an ok run (n 0): their score is a gap, never a 0."] if gaps else [])
            + select.not_finite_note(cells.values()))


def report_records(overrides: list[str], opts: dict) -> None:
    """The command: read, group, print and write ``<out>/<records stem>.md`` and ``.csv``."""
    from bench_cli.core.ui import console

    compose.check_group_choices(overrides)
    path = Path(opts["records"] or compose.compose_unchecked(overrides).results.path)
    if not path.is_file():
        raise UserError(f"give the experiment to report (attnbench report NAME; valid: "
                        f"{', '.join(compose.group_options('experiment'))}) or a records file (--records FILE): "
                        f"{path} does not exist")
    rows, dropped = one_row_per_job(csv_store.read_records(path))
    if not rows:
        raise UserError(f"{path} has no records; run `attnbench sweep ...` or `attnbench run ...` first")
    experiment = single_experiment(rows)
    if opts["format"] and experiment:  # a paper's table: the experiment's report of these records
        from bench_cli.results.report.experiment import report_experiment

        return report_experiment([experiment], overrides, {**opts, "records": str(path)})
    axis_names, shared = axes(rows)
    cells = select.aggregate(rows, SCORE, label_of(axis_names))
    render.print_lines(console, code_identity.refuse_mixed(cells.values(), opts.get("mixed_code", False)))
    table = group_rows(cells, axis_names)
    used = [r for c in cells.values() for r in c.rows]
    out_dir = Path(opts["out"] or path.parent / "reproduced")
    title = f"{path.name}: test {metric_name(used or rows)} per group"
    lines = header(path, used, axis_names, shared, rerun_command(None, path, out_dir, opts, overrides))
    cols = [*axis_names, "n", f"test {metric_name(used or rows)}", "epochs", "params", "time/epoch (s)"]
    screen = render.sized(console, opts["width"])
    render.print_table(screen, title, lines, display(table, axis_names), notes(cells, dropped), cols)
    best = trials.best_trials(rows)  # rows of an Optuna sweep: its studies' best trials below
    sections = [(trials.SECTION, trials.display(best), trials.COLUMNS,
                 trials.notes(best) + [confirmed.selection_line(confirmed.confirmations(rows))])] if best else []
    if best and (confirmations := confirmed.confirmations(rows)):  # the best settings rerun over seeds
        sections.append((confirmed.SECTION, confirmed.display(confirmations), confirmed.COLUMNS, []))
    if opts.get("pair"):  # two models on the same test samples (bench_cli/results/report/paired.py)
        found = paired.pairs(rows, None, *opts["pair"])
        sections.append((paired.title(*opts["pair"]), paired.display(found), paired.COLUMNS,
                         paired.notes(found, *opts["pair"])))
    for subtitle, shown, section_cols, section_notes in sections:
        render.print_table(screen, f"{title}: {subtitle}", [], shown, section_notes, section_cols)
    sections = [section[:3] for section in sections]
    if opts["write"]:
        # named after the whole file name: table1.records.csv -> table1.records.md, never table1.md
        md, csv, tex = (out_dir / f"{path.stem}.{suffix}" for suffix in ("md", "csv", "tex"))
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        if "markdown" in opts["formats"]:
            written.append(md)
            write_atomically(md, render.markdown(title, lines, display(table, axis_names), notes(cells, dropped), cols,
                                                 sections))
        if "csv" in opts["formats"]:
            written.append(csv)
            columns = [*axis_names, "n", "n_failed", "seeds", "epochs", "mean", "std", "params", "time_per_epoch_s",
                       "time_per_epoch_s_std", "timing_noisy"]
            csv_store.write_rows(csv, [{k: csv_value(r[k]) for k in columns} for r in table], columns, append=False)
        if "latex" in opts["formats"]:
            written.append(tex)
            write_atomically(tex, latex_of(path, rows, used))
        render.print_lines(screen, [f"wrote {', '.join(map(str, written))}"])


def single_experiment(rows: list[dict]) -> str | None:
    """The experiment every record names, when they name one and it is known here."""
    names = {r.get("experiment") or "" for r in rows}
    name = names.pop() if len(names) == 1 else ""
    return name if name and name in compose.group_options("experiment") else None


def latex_of(path: Path, rows: list[dict], used: list[dict]) -> str:
    """The paper's table of records that name no experiment: a row per model, a column per dataset
    (no paper numbers to put beside them)."""
    cells = select.aggregate(rows, SCORE)
    datasets = list(dict.fromkeys(d for d, _ in cells))
    labels = list(dict.fromkeys(m for _, m in cells))
    higher = {str(r.get("higher_is_better", "")).lower() for r in used} - {""}
    metric = metric_name(used or rows)
    return latex.table(title=f"{path.name}: test {metric}", name=path.stem, metric=f"test {metric}",
                       datasets=datasets, labels=labels, cells=cells, paper_of=lambda d, m: None, avg=None,
                       higher_is_better=higher.pop() == "true" if len(higher) == 1 else None)
