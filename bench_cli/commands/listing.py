"""`attnbench ls`: what is here (tasks, datasets and where each is read from, models with what
they cannot do, experiments, runs), read from conf/ and the registries without importing torch
where the listing does not need it, so that it answers at once."""
from __future__ import annotations

from pathlib import Path

from bench_cli.config import compose
from bench_cli.config.args import parse
from bench_cli.core.errors import UserError, unknown_choice
from bench_cli.core.ui import console, show_table

LS_SECTIONS = ("tasks", "datasets", "models", "experiments", "runs")


def cmd_ls(args: list[str]) -> None:
    p = parse("ls", args, {"--all": False})
    if len(p.positional) > 1:
        raise UserError(f"usage: attnbench ls [{'|'.join(LS_SECTIONS)}] [paths.data_root=DIR]")
    what = p.positional[0] if p.positional else "summary"
    if what not in (*LS_SECTIONS, "summary"):
        raise unknown_choice("listing", what, LS_SECTIONS)
    cfg = compose.compose_for_listing(p.overrides)
    data_root = Path(cfg.paths.data_root).expanduser()
    listings = {"summary": lambda: _ls_summary(data_root), "tasks": _ls_tasks,
                "datasets": lambda: _ls_datasets(data_root), "models": _ls_models,
                "runs": lambda: _ls_runs(Path(cfg.paths.output_dir), bool(p.get("--all"))),
                "experiments": _ls_experiments}
    listings[what]()


def _plugin_attentions() -> dict[str, dict]:
    from bench_cli.config import catalog
    from bench_cli.core.registry import is_builtin

    return {n: a for n, a in catalog.attentions().items() if not is_builtin(a["owner"])}


def _ls_summary(data_root: Path) -> None:
    from bench_cli.config import catalog

    tasks = sorted(catalog.tasks())
    models, experiments = compose.group_options("model"), compose.group_options("experiment")
    console.print(f"[bold]tasks[/] ({len(tasks)}): {', '.join(tasks)}")  # wrapped between names
    console.print(f"[bold]models[/] ({len(models)}): {', '.join(models)}")  # wrapped between names
    plugged = [f"{n} ({a['owner']})" for n, a in _plugin_attentions().items()]
    if plugged:
        console.print(f"[bold]plugin attentions[/] ({len(plugged)}): {', '.join(plugged)}")
    console.print(f"[bold]experiments[/] ({len(experiments)}): {', '.join(experiments)}")  # wrapped between names
    console.print(f"data root: {data_root}", soft_wrap=True)
    console.print("more: attnbench ls tasks | datasets | models | experiments | runs", soft_wrap=True)


def _ls_tasks() -> None:
    from bench_cli.config import catalog

    rows = [[name, f"{t['selection']} ({'higher' if t['higher_is_better'] else 'lower'} is better)",
             str(len(t["datasets"])), f"attnbench data {t['fetcher']}" if t["fetcher"] else "-"]
            for name, t in sorted(catalog.tasks().items())]
    show_table("tasks (task=NAME)", ["task", "selects on", "datasets", "data"], rows,
               caption="datasets: those the task knows; `attnbench ls datasets` also finds others under the data root")


def _ls_datasets(data_root: Path) -> None:
    """Every task's datasets under a heading with the command that fetches them: whether each is
    here and the path it is read from (or would be: a user without internet puts the files there
    by hand), relative to the data root, which is named once."""
    from rich.markup import escape

    from bench_cli.core.ui import show_groups
    from attnbench.tasks import available_tasks, task_class  # the fetchers answer: this listing imports the families
    from attnbench.tasks.fetch import fetcher

    shown = {"local": "[green]local[/]", "package": "[cyan]in package[/]", "missing": "[dim]missing[/]",
             "damaged": "[red]damaged[/]"}
    groups = []
    for name in available_tasks():
        cls = task_class(name)
        source, names = fetcher(cls.fetcher), cls.datasets(data_root)
        rows = [[ds, shown[source.status(ds, data_root)], escape(_relative(source.location(ds, data_root), data_root))]
                for ds in names]
        by_name = " DATASET" if set(names) <= set(source.datasets(data_root)) else ""  # the LRA release: as a whole
        groups.append((f"[bold]{name}[/]  (attnbench data {source.name}{by_name})", rows))
    console.print(f"[bold]datasets[/] (data root: {data_root})", soft_wrap=True, highlight=False)
    show_groups(groups)
    console.print("Paths are relative to the data root (paths.data_root=DIR or ATTNBENCH_DATA moves it); in "
                  "package: to the installed packages (site-packages). missing: the command beside its task "
                  "fetches it, or put the files at its path by hand; damaged: fetch it again with --force.",
                  highlight=False)


def _relative(location: str, data_root: Path) -> str:
    """A fetcher's location as `ls datasets` shows it: under the data root relative to it, an
    installed package's copy relative to site-packages, the home folder as ~; '-' when it says none."""
    import sysconfig

    text = location.replace(f"{data_root}/", "")
    for lib in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
        text = text.replace(f"{lib}/", "")
    return text.replace(f"{Path.home()}/", "~/") or "-"


def _model_row(model: str, names: list[str], known: dict[str, dict]) -> list[str]:
    """A model's row of `ls models`: its attentions (the last layer's decides what it can do);
    ``known``: the attentions' catalog entries (bench_cli.config.catalog)."""
    from bench_cli.core.registry import is_builtin

    unknown = [n for n in names if n not in known]
    if unknown:  # a user folder's yaml whose plugin is not imported
        return [model, f"{', '.join(unknown)} (not registered: import its plugin)", "?", "?"]
    last = known[names[-1]]
    caps = last["capabilities"]
    lacks = ", ".join(label for label, key in (("causal", "causal"), ("mask", "padding_mask"),
                                               ("any length", "variable_length"), ("cross", "cross")) if not caps[key])
    shown = [n + ("" if is_builtin(known[n]["owner"]) else f" (plugin: {known[n]['owner']})") for n in names]
    attention = " + last: ".join(shown) + (" (+ loss)" if caps["extra_loss"] else "")
    return [model, attention, lacks or "-", f"{last['paper']}, {last['equation']}"]


def _ls_models() -> None:
    from bench_cli.config import catalog

    known = catalog.attentions()
    rows, used = [], set()
    for name in compose.group_options("model"):
        m = compose.option_data("model", name)
        names = [m["attention"]["name"]] + ([m["final_attention"]["name"]] if m.get("final_attention") else [])
        used.update(names)
        rows.append(_model_row(name, names, known))
    # A plugin's attention needs no yaml: any model selects it with model.attention.name=NAME.
    plugged = _plugin_attentions()
    rows += [_model_row("(any)", [n], known) for n in plugged if n not in used]
    show_table("models (model=NAME; options: model.attention.KEY=VALUE)",
               ["model", "attention", "cannot do", "paper"], rows,
               caption="cannot do: causal (decoders), mask (padding), any length (Super's fixed l), cross "
                       "(attend to another sequence); + loss: adds an auxiliary loss (KSVD)"
                       + ("; plugin: the module that registered it; model (any): no yaml, select it in any "
                          "model with model.attention.name=NAME" if plugged else ""))


def _ls_runs(output_dir: Path, every: bool) -> None:
    from bench_cli.results.run_folder import run_folders, run_state

    states = [st for st in (run_state(d) for d in run_folders(output_dir)) if st]
    shown = states if every else states[-20:]
    style = {"ok": "green", "running": "cyan", "killed": "red", "interrupted": "yellow"}
    rows = []
    for st in shown:
        status = st.get("status", "?")
        text = ("started, not finished" if status == "killed" else f"damaged {st['damaged']}: remove the folder"
                if status == "damaged" else status)
        rows.append([str(st.get("run_id", "")), f"[{style.get(status, 'red')}]{text}[/]",
                     f"{st.get('task', '')}/{st.get('dataset', '')}", str(st.get("model", "")),
                     str(st.get("seed", "")), st["folder"]])
    show_table(f"runs in {output_dir} ({len(shown)} of {len(states)}; --all for every one)",
               ["run_id", "status", "task/dataset", "model", "seed", "folder"], rows)


def _ls_experiments() -> None:
    experiments = compose.group_options("experiment")
    # wrapped at the spaces after the commas (80 columns off a terminal); no name is cut
    console.print("[bold]experiments[/] (attnbench sweep experiment=NAME): " + (", ".join(experiments) or "none yet"),
                  highlight=False)
