"""`attnbench profile [profile=NAME] [overrides]`: compose, measure, write the CSV, show the table
and the plot, log (``logger=``)."""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.config import compose
from bench_cli.config.args import parse
from bench_cli.commands.profile.config import load_config
from bench_cli.core.files import write_atomically

USAGE = """\
usage: attnbench profile [profile=NAME] [model=M] [baseline=B] [task=T] [profile.KEY=VALUE ...] [--replot]

Parameters, FLOPs, peak memory and time of `model` next to `baseline` on synthetic inputs of
the task's shape, for every (profile.sdpa_backends, profile.d_models, profile.seq_lens) point;
one CSV row per point (profile.output), a plot (profile.plot, PNG + PDF) and a table. No dataset
is read. --replot: draw the plots again from the CSV profile.output holds, measuring nothing.
presets (profile=NAME): {presets}
example: attnbench profile model=attention_bn_sh baseline=softmax task=lra_retrieval \\
             profile.seq_lens=[1024,2048,4096] profile.d_models=[64,128,256]
keys: see conf/profile/default.yaml; `attnbench profile --cfg` prints the composed config.
"""


# --cfg prints the composed config (its optional value, as Hydra's --cfg takes, changes nothing).
PROFILE_OPTIONS = {"-h": False, "--help": False, "--cfg": ("job", "hydra", "all"), "-c": ("job", "hydra", "all"),
                   "--replot": False}


def cmd_profile(args: list[str]) -> None:
    from bench_cli.results.csv_store import write_rows
    from bench_cli.results.run_folder import new_run_id
    from bench_cli.commands.profile.render import label
    from bench_cli.core.ui import console, progress_bar

    p = parse("profile", args, PROFILE_OPTIONS, positional=False)
    if p.get("-h") or p.get("--help"):
        from bench_cli.core.ui import usage_text

        print(usage_text(USAGE.format(presets=", ".join(compose.group_options("profile")))))
        return
    show_cfg, replot, overrides = bool(p.get("--cfg") or p.get("-c")), bool(p.get("--replot")), p.overrides
    cfg = load_config(overrides)
    if show_cfg:
        print(OmegaConf.to_yaml(cfg, resolve=True))
        return
    p = cfg.profile
    if replot:
        replot_figures(cfg, overrides)
        return
    # One id for the run folder and the rows (the layout of `attnbench run`'s folders).
    run_id = new_run_id()
    run_dir = Path(str(cfg.paths.output_dir)) / "profile" / f"{datetime.now():%Y-%m-%d}" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    started = time.perf_counter()

    if str(p.mode) == "pba":
        from bench_cli.results import plots
        from bench_cli.commands.reproduce import pba

        with progress_bar(bool(cfg.trainer.get("progress", True))) as progress:
            params, flops = pba.run_pba(cfg, progress, run_id=run_id)
        write_rows(p.params_output, params, pba.PBA_PARAMS_COLUMNS, append=False)
        write_rows(p.output, flops, pba.PBA_FLOPS_COLUMNS, append=bool(p.append))
        pba.print_pba_tables(params, flops)
        console.print(pba.reference_coverage(params, p.get("reference_csv")), highlight=False)
        images = plots.pba_figures(flops, p.figures, c_attn=OmegaConf.to_container(p.eqn24))
        console.print(f"[green]ok[/]: {p.params_output}, {p.output}, " + _figure_files(images)
                      + f" ({time.perf_counter() - started:.0f} s)")
        _log(cfg, run_dir, {"pba_params": params, "pba_flops": flops}, images)
        if not all(r["match"] for r in params):
            raise SystemExit(1)
        return

    output = Path(str(p.output))
    output.parent.mkdir(parents=True, exist_ok=True)
    if not bool(p.append) and output.exists():
        output.unlink()
    from bench_cli.engine.timing import Conditions

    conditions = Conditions.now()
    rows, images = [], []
    with progress_bar(bool(cfg.trainer.get("progress", True))) as progress:
        for task_overrides in _task_overrides(p):
            task_cfg = load_config([*overrides, *task_overrides]) if task_overrides else cfg
            command = "attnbench profile " + " ".join([*overrides, *task_overrides])
            task_rows, task_images = _profile_task(task_cfg, output, progress, command, run_id)
            rows, images = rows + task_rows, images + task_images
    if p.get("report") and p.get("paper") is not None:
        from bench_cli.commands.profile.paper_table import markdown
        from bench_cli.commands.profile.render import precision

        notes = f"{p.report_notes or ''}\n\nMeasured under: {conditions.done().line()}."
        report = Path(str(p.report))
        report.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(report, markdown(rows, p.paper, f"{label(p.name)}: ratios to {cfg.baseline}"
                                          + (f" and to fused {p.fused_baseline}" if p.get("fused_baseline") else "")
                                          + f" ({precision(cfg)})", notes))
        images.append(report)
    console.print(f"[green]ok[/]: {len(rows)} points -> {output}, " + _figure_files(images)
                  + f" ({time.perf_counter() - started:.0f} s)")
    _log(cfg, run_dir, {"profile": rows}, [i for i in images if Path(i).suffix == ".png"])



def _override_value(value) -> str:
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    if isinstance(value, list):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _task_overrides(p: DictConfig) -> list[list[str]]:
    """One list of overrides per ``profile.tasks`` entry (task=NAME, profile.KEY=VALUE, and
    profile.tasks=null, so a row's command reruns its task alone); ``[[]]`` without tasks."""
    if not p.get("tasks"):
        return [[]]
    return [[f"task={entry.task}", "profile.tasks=null",
             *(f"profile.{k}={_override_value(v)}" for k, v in entry.items() if k != "task")] for entry in p.tasks]


def _profile_task(cfg: DictConfig, output: Path, progress, command: str, run_id: str) -> tuple[list[dict], list[Path]]:
    """One task's grid: rows appended to ``output`` as measured, the table shown, one plot per model."""
    from bench_cli.results.csv_store import write_rows
    from bench_cli.commands.profile import render
    from bench_cli.commands.profile.grid import PROFILE_COLUMNS, run_profile

    on_row = lambda row: write_rows(output, [row], PROFILE_COLUMNS)  # noqa: E731
    rows = run_profile(cfg, on_row, progress, command=command, run_id=run_id)
    title = render.title(cfg, rows[0]["device"] if rows else "")
    render.print_task_table(rows, title)
    return rows, task_figures(cfg, rows)


def task_figures(cfg: DictConfig, rows: list[dict]) -> list[Path]:
    """One figure per measured model (render.plot_paths), from its rows (measured or read back)."""
    from bench_cli.results import plots
    from bench_cli.commands.profile import render

    images = []
    for model, plot in render.plot_paths(cfg) if rows else []:
        mine = [r for r in rows if r["model"] == model]
        if mine:
            images.append(plots.ratio_figure(mine, plot, *render.figure_titles(cfg, model, mine)))
    return images


def replot_figures(cfg: DictConfig, overrides: list[str]) -> None:
    """`--replot`: the figures drawn again from the CSV a profile wrote (profile.output), nothing
    measured: new figure code applied to committed numbers."""
    from bench_cli.core.errors import UserError
    from bench_cli.core.ui import console
    from bench_cli.results import plots
    from bench_cli.results.csv_store import read_records

    p = cfg.profile
    output = Path(str(p.output))
    if not output.is_file():
        raise UserError(f"--replot: no such file: {output} (profile.output; run the profile without --replot first)")
    rows = [r for r in read_records(output) if r.get("model")]
    if str(p.mode) == "pba":
        images = plots.pba_figures(rows, p.figures, c_attn=OmegaConf.to_container(p.eqn24))
    else:  # per task of profile.tasks, as measured
        images = []
        for task_overrides in _task_overrides(p):
            task_cfg = load_config([*overrides, *task_overrides]) if task_overrides else cfg
            images += task_figures(task_cfg, [r for r in rows if r.get("task") in (None, "", str(task_cfg.task.name))])
    if not images:
        raise UserError(f"--replot: no figure to draw from {output} (profile.plot is null, or no row of its models)")
    console.print(f"[green]ok[/]: from {output} (nothing measured): " + _figure_files(images), highlight=False)


def _figure_files(images: list[Path]) -> str:
    """'a.png (+ a.pdf), report.md': each figure and its vector copy."""
    from bench_cli.results.plots import vector_path

    return ", ".join(f"{i} (+ {vector_path(i).name})" if Path(i).suffix == ".png" else str(i) for i in images)


def _log(cfg: DictConfig, run_dir: Path, tables: dict[str, list[dict]], images: list[Path]) -> None:
    from bench_cli.results.loggers import make_logger
    from bench_cli.commands.profile.render import label

    if cfg.logger.get("name", "none") == "none":
        return
    config = OmegaConf.to_container(cfg, resolve=True)
    logger = make_logger(cfg.logger, config, run_dir, name=label(cfg.profile.name).replace(" ", "-"), job_type="profile")
    try:
        for name, rows in tables.items():
            logger.log_table(name, [{k: v for k, v in r.items() if isinstance(v, (int, float, str, bool)) or v is None}
                                    for r in rows])
        for image in images:
            logger.log_image(Path(image).stem, image)
    finally:
        logger.finish("ok")
