"""`attnbench` command line: run | validate | ls | data | bench.

Subcommands that train go through a ``@hydra.main`` function (by rewriting ``sys.argv``) so
Hydra's override grammar, ``--cfg``, multirun and the launcher plugins all keep working; the
configuration is composed and checked first so mistakes become one line and exit status 2.
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from bench_cli import compose as C
from bench_cli.errors import UserError, unknown_choice
from bench_cli.ui import console, fail, print_summary, progress_bar

USAGE = """\
usage: attnbench <command> [overrides...]

commands:
  run [overrides]        train and evaluate one model, append a record to results/runs.csv
  validate [overrides]   compose the config, check the data, build the model, print the config
  ls [tasks|datasets|models|experiments]
                         list what can be run, and which datasets are available locally
  data TASK [NAME]       put a dataset under the data root (copy from a package, download, --generate)
  sweep [--force] [overrides]
                         run a grid (experiment=primal_dual/table1, comma lists) through Hydra's
                         launchers; resumes: jobs with an ok record are skipped
  report NAME            paper vs reproduced table of an experiment (results/reproduced/)
  profile [overrides]    FLOPs, memory, time and parameter ratios of model vs baseline (no data)
  bench [--seq-lens ...] time every attention variant against softmax

overrides use Hydra's syntax: task=uea task.dataset=BasicMotions model=attention_bn_sh
trainer.max_epochs=50 seed=3 +key=value; `attnbench run --cfg job` prints the composed config.
"""


def validate_config(cfg: DictConfig, load: bool = False):
    """Checks every run needs before it starts. With ``load``, also load data and build the model."""
    from bench_cli.runner import build_task, check_model_fits_task

    task = build_task(cfg)
    task.check_data()
    if str(cfg.task.get("protocol", "holdout")) not in ("holdout", "paper"):
        raise unknown_choice("protocol", cfg.task.protocol, ["holdout", "paper"])
    check_model_fits_task(task, cfg)
    if not load:
        return task, None
    task.setup(str(cfg.task.protocol))
    try:
        model = task.build_model(cfg.model)
    except (TypeError, ValueError) as e:
        raise UserError(f"cannot build model '{cfg.model.name}': {e}") from None
    return task, model


# --- run ------------------------------------------------------------------------------------
@hydra.main(version_base="1.3", config_path="pkg://conf", config_name=C.CONFIG_NAME)
def _hydra_run(cfg: DictConfig) -> None:
    from bench_cli.runner import run_experiment

    hc = HydraConfig.get()
    try:
        with progress_bar(bool(cfg.trainer.progress)) as progress:
            row = run_experiment(cfg, Path(hc.runtime.output_dir), progress, overrides=list(hc.overrides.task))
    except UserError as e:
        fail(str(e))
    print_summary(row)
    if row["status"] != "ok":
        console.print(f"[red]run {row['status']}[/]: {row.get('error', '')}  (details: {row['output_dir']})")
        raise SystemExit(1)


def _dispatch_to_hydra(entry, args: list[str]) -> None:
    # A fresh id per invocation: two runs started in the same second (or in one process, as the
    # tests do) must never share an output folder.
    os.environ["ATTNBENCH_RUN_ID"] = uuid.uuid4().hex[:6]
    sys.argv = ["attnbench", *args]
    entry()


def cmd_run(args: list[str]) -> None:
    flags, overrides = C.split_args(args)
    if not {"--help", "-h", "--hydra-help", "--info", "-i", "--version"} & set(flags):
        validate_config(C.compose(overrides))
    _dispatch_to_hydra(_hydra_run, args)


# --- validate -------------------------------------------------------------------------------
def cmd_validate(args: list[str]) -> None:
    from rich.syntax import Syntax

    from bench_cli.measure import attention_parameters, count_parameters

    _, overrides = C.split_args(args)
    cfg = C.compose(overrides)
    task, model = validate_config(cfg, load=True)
    console.print(Syntax(OmegaConf.to_yaml(cfg, resolve=True), "yaml", background_color="default"))
    facts = ", ".join(f"{k}={v}" for k, v in task.describe().items())
    console.print(f"[green]ok[/]: {cfg.task.name}/{task.dataset_name} ({facts})")
    attn = attention_parameters(model)
    console.print(f"[green]ok[/]: model {cfg.model.name}: {count_parameters(model):,} parameters, "
                  f"{attn['attn_layers']} attention layers of {attn['attn_params_per_layer']:,}")


# --- ls -------------------------------------------------------------------------------------
def cmd_ls(args: list[str]) -> None:
    from rich.table import Table

    from models.attention import attention_spec
    from tasks import available_tasks, task_class

    what = args[0] if args else "all"
    sections = ["tasks", "datasets", "models", "experiments"]
    if what != "all" and what not in sections:
        raise unknown_choice("listing", what, sections + ["all"])
    cfg = C.compose([a for a in args[1:] if "=" in a])
    data_root = Path(cfg.paths.data_root).expanduser()

    if what in ("all", "tasks", "datasets"):
        t = Table(title=f"tasks and datasets (data root: {data_root})")
        for col in ("task", "dataset", "status"):
            t.add_column(col)
        for name in available_tasks():
            cls = task_class(name)
            for ds in cls.datasets(data_root):
                status = cls.dataset_status(ds, data_root)
                style = {"local": "green", "package": "cyan", "missing": "dim"}[status]
                shown = {"local": "local", "package": "in package", "missing": f"missing: attnbench data {name} {ds}"}[status]
                if what == "tasks" and status == "missing":
                    continue
                t.add_row(name, ds, f"[{style}]{shown}[/]")
        console.print(t)
    if what in ("all", "models"):
        t = Table(title="models (model=NAME; attention options: model.attention.KEY=VALUE)")
        for col in ("model", "attention", "paper", "equation", "causal", "mask", "any length", "extra loss"):
            t.add_column(col)
        for name in C.group_options("model"):
            m = C.load_option("model", name)
            att = m.attention.name + (f" + last: {m.final_attention.name}" if m.get("final_attention") else "")
            spec = attention_spec(m.get("final_attention", {}).get("name") if m.get("final_attention") else m.attention.name)
            caps = spec.capabilities
            yn = lambda b: "[green]yes[/]" if b else "[red]no[/]"  # noqa: E731
            t.add_row(name, att, spec.paper, spec.equation, yn(caps.causal), yn(caps.padding_mask),
                      yn(caps.variable_length), yn(caps.extra_loss))
        console.print(t)
    if what in ("all", "experiments"):
        exps = C.group_options("experiment")
        console.print("[bold]experiments[/] (attnbench run experiment=NAME): " + (", ".join(exps) or "none yet"))


# --- data -----------------------------------------------------------------------------------
def cmd_data(args: list[str]) -> None:
    from tasks import available_tasks, task_class

    force = "--force" in args
    positional = [a for a in args if not a.startswith("-") and "=" not in a]
    # Other flags are task-specific fetch options: --generate -> generate=True, --num-train=5 -> num_train="5".
    options = {a[2:].split("=", 1)[0].replace("-", "_"): (a.split("=", 1)[1] if "=" in a else True)
               for a in args if a.startswith("--") and a != "--force"}
    usage = (f"usage: attnbench data TASK [NAME] [--force] [--OPTION[=VALUE]...] [paths.data_root=DIR]; "
             f"tasks: {', '.join(available_tasks())}")
    if len(positional) not in (1, 2):
        raise UserError(usage)
    cfg = C.compose([a for a in args if "=" in a and not a.startswith("-")])
    cls = task_class(positional[0])
    task_name, data_root = positional[0], Path(cfg.paths.data_root).expanduser()
    names = cls.datasets(data_root)
    if len(positional) == 2:
        dataset = positional[1]
    else:  # NAME may be left out when the task has one dataset (or picks one from the options)
        pick = getattr(cls, "default_dataset", None)
        dataset = pick(**options) if pick else (names[0] if len(names) == 1 else None)
        if dataset is None:
            raise UserError(f"{usage}; {task_name} datasets: {', '.join(names)}")
    if dataset not in names:
        raise unknown_choice(f"{task_name} dataset", dataset, names)
    where = cls.fetch(dataset, data_root, force=force, **options)
    console.print(f"[green]ok[/]: {task_name}/{dataset} is in {where}")


def cmd_bench(args: list[str]) -> None:
    from bench_cli.bench_attention import main as bench_main

    bench_main(args)


COMMANDS = {"run": cmd_run, "validate": cmd_validate, "ls": cmd_ls, "data": cmd_data, "bench": cmd_bench}
# Commands living in their own modules (imported only when used): name -> "module:function".
LAZY_COMMANDS = {
    "sweep": "bench_cli.sweep:cmd_sweep",
    "report": "bench_cli.report:cmd_report",
    "profile": "bench_cli.profile:cmd_profile",
}


def _command(name: str):
    if name in COMMANDS:
        return COMMANDS[name]
    import importlib

    module, func = LAZY_COMMANDS[name].split(":")
    return getattr(importlib.import_module(module), func)


def available_commands() -> list[str]:
    import importlib.util

    lazy = [n for n, target in LAZY_COMMANDS.items() if importlib.util.find_spec(target.split(":")[0])]
    return sorted([*COMMANDS, *lazy])


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    cmd, rest = args[0], args[1:]
    if cmd not in available_commands():
        fail(str(unknown_choice("command", cmd, available_commands())))
    try:
        _command(cmd)(rest)
    except UserError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
