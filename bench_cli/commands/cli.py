"""`attnbench` command line: run | validate | ls | data | bench.

Subcommands that train go through a ``@hydra.main`` function (by rewriting ``sys.argv``) so
Hydra's override grammar, ``--cfg``, multirun and the launcher plugins all keep working; the
configuration is composed and checked first so mistakes become one line and exit status 2.
"""
from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf, open_dict

from bench_cli.config import compose
from bench_cli.config.args import HelpRequested, parse
from bench_cli.core.errors import (DataNotFoundError, UserError, catch_termination, exit_code_of, first_line,
                                   interruption_name, path_error, unknown_choice)
from bench_cli.core.phases import PHASES, process_age_s
from bench_cli.core.registry import Registry
from bench_cli.core.ui import HELP_WIDTH, console, err_console, fail, print_summary, progress_bar, usage_text

# Nothing above imports torch or Hydra: `--help`, `ls` and a misspelt override answer at once;
# the commands that train, validate or list datasets import them where they need them.

RUN_ID_ENV = "ATTNBENCH_RUN_ID"

USAGE = """\
usage: attnbench <command> [overrides...]

commands:
  run [overrides]        train and evaluate one model, append a record to
                         results/runs.csv
  validate [overrides]   compose the config, check the data, build the model,
                         print the config
  ls [tasks|datasets|models|experiments|runs]
                         list what can be run, which datasets are available
                         locally and where each is read from, and the runs made
                         (ls runs: the latest 20 runs, their status and
                         folders; --all)
  data TASK [NAME]       put a dataset under the data root (copy from a package,
                         download, --generate)
  sweep [--dry-run] [--force] [overrides]
                         run a grid (experiment=primal_dual/table1, comma lists)
                         through Hydra's launchers; resumes: jobs with an ok
                         record are skipped; --dry-run lists the jobs (done, to
                         run, data missing) and runs nothing; with
                         hydra/sweeper=optuna, a hyperparameter search
                         (docs/tuning.md)
  report NAME            an experiment's table: the paper, your runs and the
                         committed reproduction (records found from any folder;
                         --format latex for a paper)
  evaluate CHECKPOINT [--split test]
                         evaluate a run's checkpoint
                         (trainer.checkpoint.keep_final=true) on a split
  profile [overrides]    FLOPs, memory, time and parameter ratios of model vs
                         baseline (no data)
  bench [--seq-lens ...] time every attention variant against softmax
  bench --against-reference [--seq-lens ...]
                         time the efficient-attention baselines against their
                         reference code
  bench-cli [--repeat N] time --help, ls and a misspelt override next to
                         `import torch`
  bench-overhead [--repeats N] [--cases NAME,...]
                         time `attnbench run` against a bare PyTorch loop of the
                         same config
  check-attention NAME [--length N ...] [KEY=VALUE ...]
                         conformance suite of a registered attention (built-in
                         or plugin)
  smoke [--device cuda|cpu] [--only TASK,...] [--data-root DIR] [--require-data]
                         every family briefly on every GPU (fp32, autocast, DDP,
                         profile); results/smoke/; a family without its data
                         trains on synthetic inputs (--require-data: fails)

overrides use Hydra's syntax: task=uea task.dataset=BasicMotions
model=attention_bn_sh trainer.max_epochs=50 seed=3 +key=value;
`attnbench run --cfg job` prints the composed config; `attnbench --version` the
installed version.
"""


# --- run ------------------------------------------------------------------------------------
def _train_and_print_summary(cfg: DictConfig, resolved: dict) -> None:
    """The job of `attnbench run`: train, record, print the summary (inside Hydra's run_job).
    ``resolved``: its config resolved, once (run_claim.resolved_job_config)."""
    from hydra.core.hydra_config import HydraConfig

    from bench_cli.engine.runner import run_experiment

    from rich.markup import escape

    hc = HydraConfig.get()
    try:
        with progress_bar(bool(cfg.trainer.progress)) as progress:
            outcome = run_experiment(cfg, Path(hc.runtime.output_dir), progress, overrides=list(hc.overrides.task),
                                     run_id=os.environ.get(RUN_ID_ENV), resolved=resolved)
    except UserError as e:
        fail(str(e))
    row = outcome.record
    if outcome.rank:  # another process of a distributed run: rank 0 reports
        if row["status"] != "ok":
            raise SystemExit(1)
        return
    print_summary(row, str(cfg.results.path), outcome.logged)
    if outcome.append_error:
        err_console.print(f"[bold red]error:[/] {escape(outcome.append_error)}", highlight=False, soft_wrap=True)
        raise SystemExit(1)
    if row["status"] != "ok":
        console.print(f"[red]run {row['status']}[/]: {escape(row.get('error') or '')}  (details: {row['output_dir']})",
                      soft_wrap=True)  # the folder's path unbroken
        raise SystemExit(1)


def _hydra_run() -> None:
    """Only for Hydra's own flags (--help, --info, --cfg): nothing is trained through it. Decorated
    when called, so that importing this module does not import Hydra."""
    import hydra

    @hydra.main(version_base=compose.HYDRA_VERSION_BASE, config_path="pkg://attnbench.conf", config_name=compose.CONFIG_NAME)
    def entry(cfg: DictConfig) -> None:
        raise SystemExit("attnbench run: internal error: the Hydra entry point only serves Hydra's flags")

    entry()


_HYDRA_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--version", "--cfg", "-c", "--resolve",
                     "--package", "-p", "--shell-completion", "-sc"}


def check_model_on_data(task, cfg: DictConfig):
    """Build the model for the loaded data and run it forward on two training samples, so that
    `validate` rejects what the run would (e.g. a Conv2D grid that does not match the length)."""
    import torch

    from bench_cli.engine.measure import example_batch

    try:
        model = task.build_model(cfg.model)
        model.eval()
        with torch.no_grad():
            model(**task.model_inputs(example_batch(task, "train", 2, torch.device("cpu"))))
    except Exception as e:  # noqa: BLE001 - validate records nothing: any failure is its one line
        raise UserError(f"model '{cfg.model.name}' cannot run on {cfg.task.name}/{task.dataset_name}: "
                        f"{'' if isinstance(e, (TypeError, ValueError)) else type(e).__name__ + ': '}"
                        f"{first_line(e)}") from None
    return model


def check_single_job(cfg: DictConfig, overrides: list[str]) -> None:
    """An experiment that is a grid (hydra.sweeper.params) runs through `attnbench sweep`; `run`
    takes it only when every axis is fixed on the command line."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    axes = {k: compose.parse_override(f"{k}={v}") for k, v in params.items() if k not in given}
    open_axes = [k for k, o in axes.items() if o.is_sweep_override()]
    if open_axes:
        n = 1
        for k in open_axes:
            n *= len(list(axes[k].sweep_string_iterator())) if axes[k].is_discrete_sweep() else 1
        searched = [k for k in open_axes if not axes[k].is_discrete_sweep()]  # interval(): Optuna samples it
        what = f"a search over {', '.join(searched)}" if searched else f"a grid of {n} jobs over {', '.join(open_axes)}"
        name = OmegaConf.select(cfg, "experiment_name", default=None) or "this experiment"
        raise UserError(f"{name} is {what}: run it with "
                        f"`attnbench sweep {' '.join(overrides)}`, or fix {', '.join(open_axes)} to run one job")


RUN_USAGE = """\
usage: attnbench run [overrides...]

Train and evaluate one model and append its record to results.path (results/runs.csv). An
experiment that is a grid (several datasets, models or seeds) runs with `attnbench sweep`.

config groups (group=option; `attnbench ls tasks|models|experiments` describes them):
{groups}

overrides use Hydra's syntax: task=uea task.dataset=BasicMotions model=attention_bn
trainer.max_epochs=5 seed=3 +key=value
  --cfg job      print the composed config (every key there can be overridden); runs nothing
  --info         Hydra's view of the config search path and defaults list
  --hydra-help   Hydra's own flags
"""


def run_usage() -> str:
    """`attnbench run --help`: every config group with its options (building blocks whose names
    start with '_' are not options: index.group_options leaves them out)."""
    import textwrap

    groups = dict.fromkeys(d.name for folder in compose.config_dirs() if folder.is_dir()
                           for d in sorted(folder.iterdir())
                           if d.is_dir() and not d.name.startswith(("_", ".")) and d.name != "hydra")
    lines = [textwrap.fill(f"{g}: {', '.join(options)}", HELP_WIDTH, initial_indent="  ", subsequent_indent="      ",
                           break_on_hyphens=False) for g in sorted(groups) if (options := compose.group_options(g))]
    return RUN_USAGE.format(groups="\n".join(lines))


def cmd_run(args: list[str]) -> None:
    if args and args[0] in ("-h", "--help"):
        print(usage_text(run_usage()))
        return
    p = parse("run", args, {}, hydra=True, positional=False)
    if {"-m", "--multirun"} & set(p.hydra):
        raise UserError("`attnbench run` runs one job; for a grid use `attnbench sweep` (it resumes and records failures)")
    if _HYDRA_INFO_FLAGS & set(p.hydra):  # Hydra prints what was asked; nothing runs
        if p.overrides:  # a mistake in them is our one line (valid choices named), not Hydra's listing
            compose.compose_run(p.overrides)
        compose.dispatch_to_hydra(_hydra_run, args)
        return
    if p.hydra:
        raise UserError(f"unknown option '{next(iter(p.hydra))}' for `attnbench run` (overrides are key=value; "
                        f"Hydra's --cfg job, --info and --help work)")
    overrides = p.overrides
    with PHASES("compose"):
        cfg = compose.compose_run(overrides)  # the run's config, composed once
    check_single_job(cfg, overrides)
    from bench_cli.results.run_folder import new_run_id
    from bench_cli.commands.run_claim import job_claimed, resolved_job_config
    from bench_cli.commands.validate import check_config

    with PHASES("validate"):
        check_config(cfg, build=True, recorded=True)  # a model that fails when it runs is a failed row
    note_invocation()
    # One id everywhere: the run folder (hydra.run.dir), the record and the summary. The processes
    # of a distributed run take rank 0's; the others keep their logs in rank<N>/ inside its folder.
    run_id = new_run_id()
    if str(cfg.trainer.get("strategy", "none")) != "none":
        from bench_cli.engine import distributed

        env = distributed.setup(str(cfg.trainer.strategy), str(cfg.trainer.device))
        run_id = distributed.broadcast(run_id) + (f"/rank{env.rank}" if env.rank else "")
    os.environ[RUN_ID_ENV] = run_id
    resolved = resolved_job_config(cfg)
    try:
        with job_claimed(cfg, resolved):
            compose.run_job(cfg, functools.partial(_train_and_print_summary, resolved=resolved))
    except KeyboardInterrupt as e:
        fail(f"interrupted ({interruption_name(e)}): recorded as 'interrupted' in {cfg.results.path}{resume_hint(cfg)}",
             code=exit_code_of(e))


def resume_hint(cfg: DictConfig) -> str:
    """What the same command does next, as the folder says it (a checkpoint of the job there),
    never what the settings alone would suggest."""
    from bench_cli.engine.checkpoint import resumable_from
    from bench_cli.results.job_keys import job_key

    if not OmegaConf.select(cfg, "trainer.checkpoint.enabled", default=False):
        return ""
    if str(OmegaConf.select(cfg, "trainer.resume")) == "false":
        return "; with trainer.resume=false the same command starts over"
    job = cfg.copy()
    with open_dict(job):
        job.pop("hydra", None)  # as the job had its config (hydra.core.utils.run_job)
    path = resumable_from(job, job_key(job))
    return f"; the same command resumes from its checkpoint {path}" if path else "; no checkpoint was written: the same command starts over"


# --- validate -------------------------------------------------------------------------------
def cmd_validate(args: list[str]) -> None:
    overrides = parse("validate", args, {}, positional=False).overrides
    cfg = compose.compose(overrides, with_hydra=True)
    check_single_job(cfg, overrides)
    from rich.syntax import Syntax

    from bench_cli.engine.counting import attention_parameters, count_parameters
    from bench_cli.commands.validate import check_config

    with open_dict(cfg):
        del cfg["hydra"]
    task = check_config(cfg, build=True)
    task.setup(str(cfg.task.protocol))
    model = check_model_on_data(task, cfg)
    console.print(Syntax(OmegaConf.to_yaml(cfg, resolve=True), "yaml", background_color="default"))
    facts = ", ".join(f"{k}={v}" for k, v in task.describe().items())
    console.print(f"[green]ok[/]: {cfg.task.name}/{task.dataset_name} ({facts})", soft_wrap=True)
    attn = attention_parameters(model)
    console.print(f"[green]ok[/]: model {cfg.model.name}: {count_parameters(model):,} parameters, "
                  f"{attn['attn_layers']} attention layers of {attn['attn_params_per_layer']:,}", soft_wrap=True)


# --- data -----------------------------------------------------------------------------------
def cmd_data(args: list[str]) -> None:
    from attnbench.tasks.fetch import available_fetchers, fetcher

    p = parse("data", args, {"--force": False}, free_options=True)
    usage = (f"usage: attnbench data SOURCE [DATASET] [--force] [--OPTION[=VALUE]...] [paths.data_root=DIR]; "
             f"sources: {', '.join(available_fetchers())}")
    if len(p.positional) not in (1, 2):
        raise UserError(usage)
    source = fetcher(p.positional[0])
    force = bool(p.options.pop("--force", False))
    options = {k[2:].replace("-", "_"): v for k, v in p.options.items()}
    source.check_options(options)
    cfg = compose.compose(p.overrides)
    options = source.options_from_config(cfg.task, options)
    data_root = Path(cfg.paths.data_root).expanduser()
    names = source.datasets(data_root)
    dataset = p.positional[1] if len(p.positional) == 2 else source.default_dataset(data_root, **options)
    if dataset is None:
        raise UserError(f"give a dataset: attnbench data {source.name} NAME; {source.name} datasets: {', '.join(names)}")
    if dataset not in names:
        raise unknown_choice(f"{source.name} dataset", dataset, names)
    try:
        where = source.fetch(dataset, data_root, force=force, **options)
    except DataNotFoundError as e:  # the fetchers' messages end "... or run <this very command>": not a way out here
        raise DataNotFoundError(re.sub(rf",? or run `attnbench data {re.escape(source.name)} {re.escape(dataset)}`",
                                       "", str(e))) from None
    console.print(f"[green]ok[/]: {source.name}/{dataset} is in {where}", soft_wrap=True)


def cmd_sweep(args: list[str]) -> None:
    from bench_cli.commands import sweep

    note_invocation()
    planned = sweep.plan_command(args)
    if planned is None:
        return
    grid, force, dry_run = planned
    if not sweep.is_search(grid.master):
        return sweep.run_grid(grid, force, dry_run)
    from bench_cli.commands.study import run_studies  # hydra/sweeper=optuna: each job of the grid is a study

    if force:
        raise UserError("--force does not apply to an Optuna sweep: a study is continued, never rerun; "
                        "for a new one give hydra.sweeper.study_name=NAME")
    run_studies(grid, dry_run)


# The verbs. A "module:function" entry is imported when it is run: most verbs import torch, and
# `--help`, `ls` and a misspelt override must not wait for it.
COMMANDS: Registry[Callable[[list[str]], None]] = Registry("command")
COMMANDS.register("run", cmd_run, owner=__name__)
COMMANDS.register("validate", cmd_validate, owner=__name__)
COMMANDS.register("ls", "bench_cli.commands.listing:cmd_ls", owner=__name__)
COMMANDS.register("data", cmd_data, owner=__name__)
COMMANDS.register("sweep", cmd_sweep, owner=__name__)
COMMANDS.register("report", "bench_cli.commands.report:cmd_report", owner=__name__)
COMMANDS.register("profile", "bench_cli.commands.profile:cmd_profile", owner=__name__)
# parsed there, with bench_cli.config.args.parse (`python -m bench_cli.commands.bench_attention` too)
COMMANDS.register("bench", "bench_cli.commands.bench_attention:main", owner=__name__)
COMMANDS.register("check-attention", "bench_cli.commands.check_attention:cmd_check_attention", owner=__name__)
COMMANDS.register("bench-cli", "bench_cli.commands.profile.cli_speed:main", owner=__name__)
# a job against a bare loop; then the GPU smoke check of every family
COMMANDS.register("bench-overhead", "bench_cli.commands.profile.overhead:main", owner=__name__)
COMMANDS.register("smoke", "bench_cli.commands.smoke:cmd_smoke", owner=__name__)
COMMANDS.register("evaluate", "bench_cli.commands.evaluate:cmd_evaluate", owner=__name__)


def command_usage(command: str, options: dict) -> str:
    """`attnbench COMMAND --help` for a command without a usage text of its own: its entry of USAGE
    (the lines from its name to the next command) and the options it takes."""
    lines, mine = [], False
    for line in USAGE.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            mine = line.split()[0] == command
        elif not line.startswith("   "):
            mine = False
        if mine:
            lines.append(line)
    valid = ", ".join(sorted(options)) or "none"
    return "\n".join([f"usage: attnbench {command} ...", *lines, f"options: {valid}"])


COMPOSING = ("run", "validate", "ls", "data", "sweep", "report", "profile")  # take --config-dir / --config-path
CONFIG_FLAGS = {"--config-dir": compose.add_config_dir, "-cd": compose.add_config_dir,
                "--config-path": compose.set_config_path, "-cp": compose.set_config_path}


def take_config_dirs(args: list[str]) -> list[str]:
    """``args`` without Hydra's ``--config-dir DIR`` / ``-cd DIR`` / ``--config-dir=DIR`` (folders
    added to every composition of the process: plugins' model/*.yaml, experiments) and
    ``--config-path DIR`` / ``-cp DIR`` (the folder of the root config.yaml)."""
    rest, i = [], 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in CONFIG_FLAGS:
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    raise UserError(f"option {name} needs a folder: {name} DIR")
                i, value = i + 1, args[i + 1]
            CONFIG_FLAGS[name](value)
        else:
            rest.append(args[i])
        i += 1
    return rest


_TYPED: list[str] = []  # the command line as typed, before Hydra rewrites sys.argv


def note_invocation() -> None:
    """Put the typed command in the environment for the records (``provenance.invocation``; a
    sweep's workers inherit it). Called by the commands that record, once their config is checked."""
    import shlex

    from bench_cli.results.provenance import COMMAND_ENV

    if _TYPED:
        os.environ[COMMAND_ENV] = shlex.join(_TYPED)


def check_working_folder() -> None:
    """The working folder exists: Hydra records it in every config it composes (``os.getcwd()``,
    hydra.runtime.cwd) and every relative path (results/, outputs/, data/) starts from it. One line
    when it was deleted (or moved) under the shell; ``$PWD`` names it when the shell set it."""
    try:
        os.getcwd()
    except FileNotFoundError:
        gone = os.environ.get("PWD", "")
        where = f" {gone}" if gone and not os.path.isdir(gone) else ""
        raise UserError(f"the working folder{where} no longer exists (deleted or moved): cd to an existing folder "
                        "and run the command again") from None


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage_text(USAGE))
        return
    if args[0] in ("--version", "-V"):
        from bench_cli import __version__

        print(f"attnbench {__version__}")
        return
    cmd, rest = args[0], args[1:]
    PHASES.mark("startup", process_age_s())  # the interpreter and the imports so far (bench-overhead)
    _TYPED[:] = ["attnbench", *args]
    try:
        COMMANDS.check(cmd)
    except UserError as e:
        fail(str(e))
    catch_termination()  # SIGTERM unwinds like Ctrl-C: a run records its row before the process exits
    try:
        check_working_folder()
        from bench_cli.config import plugins

        plugins.import_plugins()  # ATTNBENCH_PLUGINS and entry points, before anything composes
        if cmd in COMPOSING:
            rest = take_config_dirs(rest)
        COMMANDS.get(cmd)(rest)
    except HelpRequested as h:
        print(usage_text(command_usage(h.command, h.options)))
    except UserError as e:
        fail(str(e))
    except OSError as e:  # a path the user gave that cannot be written (a run records its own failures)
        problem = path_error(e)
        if problem is None:
            raise
        fail(str(problem))
    except KeyboardInterrupt as e:  # any command: one line, no traceback (run records it first)
        fail(f"interrupted: attnbench {cmd} stopped ({interruption_name(e)})", code=exit_code_of(e))


def entry() -> None:
    """The console script (and ``python -m bench_cli.cli``): ``main``, then, after `run`, the process
    ends without tearing the interpreter down. Every file of the run is written and closed by
    then; what is left is freeing torch's, Hydra's and the data libraries' objects one by one,
    about 1 s on 2 cores, that no user waits for gladly (bench-overhead's "exit"). Not when
    something may still need the normal shutdown: wandb's service, child processes."""
    code: int | str | None = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    if _TYPED[1:2] == ["run"] and "wandb" not in sys.modules:
        import multiprocessing

        if not multiprocessing.active_children():
            import logging

            if isinstance(code, str):
                print(code, file=sys.stderr)
                code = 1
            logging.shutdown()  # Hydra's log file handlers flushed and closed
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # a closed pipe: nothing more to say there
                    pass
            os._exit(code or 0)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
