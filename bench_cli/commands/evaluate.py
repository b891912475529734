"""`attnbench evaluate CHECKPOINT`: the weights of a job's checkpoint (bench_cli/engine/checkpoint.py)
evaluated on a split with the run's own config (stored in the checkpoint), the metrics printed.

The weights are the selected ones when the checkpoint holds them (the protocol's reported
weights: the best validation evaluation of a holdout run), else the last ones; ``--weights last``
takes the last. A checkpoint written by another code version says so in one line; one whose
weights do not fit the model this code builds from its config says what differs in one line.

Nothing the file names is imported: a checkpoint is data (bench_cli/engine/checkpoint.py reads it
without running code), and its stored config's ``plugins`` are only names. The plugins the run
was made with (the checkpoint's ``meta.plugins``, and its config's ``plugins``) are imported only
when the user names them, in ``ATTNBENCH_PLUGINS`` or as ``plugins=[mod]`` on this command line; a
checkpoint whose attention or task is one of theirs, evaluated without them, is one line naming them.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

USAGE = """\
usage: attnbench evaluate CHECKPOINT [--split test|val|train] [--weights selected|last] [paths.data_root=DIR]
                          [plugins=[MODULE,...]]

Evaluates the weights of a checkpoint (checkpoints/<job_key>/ckpt-N.pt beside the records file; an
ok job's is kept with trainer.checkpoint.keep_final=true) with the run's own config, and prints
the metrics of the split. --weights selected (default): the evaluation the protocol selected, when
the checkpoint holds its weights; last: the weights of the last step. A checkpoint made with plugins
is evaluated with them named here (plugins=[mymod]) or in ATTNBENCH_PLUGINS: nothing the file names
is imported.
"""

SPLITS = ("test", "val", "train")


def cmd_evaluate(args: list[str]) -> None:
    from bench_cli.config.args import parse
    from bench_cli.core.errors import UserError, unknown_choice

    if any(a in ("-h", "--help") for a in args):
        from bench_cli.core.ui import usage_text

        print(usage_text(USAGE))
        return
    p = parse("evaluate", args, {"--split": 1, "--weights": 1})
    if len(p.positional) != 1:
        raise UserError("usage: attnbench evaluate CHECKPOINT [--split test|val|train] [--weights selected|last]")
    split, weights = p.get("--split") or "test", p.get("--weights") or "selected"
    if split not in SPLITS:
        raise unknown_choice("split", split, SPLITS)
    if weights not in ("selected", "last"):
        raise unknown_choice("--weights", weights, ("selected", "last"))
    path = Path(p.positional[0])
    if not path.is_file():
        raise UserError(f"no checkpoint file {path}")
    metrics, note = evaluate_checkpoint(path, split, weights, p.overrides)
    from bench_cli.core.ui import console, show_table

    if note:
        console.print(note, highlight=False, soft_wrap=True, markup=False)
    show_table(f"{path.name}: {split}", ["metric", "value"], [[k, f"{v:.6g}"] for k, v in metrics.items()])


def evaluate_checkpoint(path: Path, split: str, weights: str = "selected", overrides: list[str] = ()) -> tuple[dict, str]:
    """(metrics of ``split``, a note when the checkpoint comes from another code version)."""
    import torch
    import yaml
    from omegaconf import OmegaConf

    from bench_cli.config import plugins

    from bench_cli.results.provenance import provenance
    from bench_cli.engine.checkpoint import read
    from bench_cli.core.errors import UserError
    from bench_cli.config.taskfit import build_task
    from bench_cli.engine.env import seed_everything, select_device
    from bench_cli.engine.trainer import Trainer

    state = read(path)
    if not isinstance(state["meta"].get("config"), dict):
        raise UserError(f"checkpoint {path} holds no run config to evaluate it with")
    cfg = OmegaConf.create(state["meta"]["config"])
    for override in overrides:  # where the data is on this machine, its device...
        key, _, value = override.partition("=")
        if key == "plugins" and _:  # named by the user: imported (the file's own names never are)
            plugins.import_configured({"plugins": yaml.safe_load(value)})
            continue
        if key.split(".")[0] not in ("paths", "trainer") or not _:
            raise UserError("evaluate takes only paths.*, trainer.* and plugins= overrides (the run's config is the "
                            f"checkpoint's): {override}")
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    needed = made_with(state["meta"], cfg)
    here = {k: str(v) for k, v in provenance().items() if k in state["meta"]}
    differs = [f"{k} {state['meta'][k]} (here {here[k]})" for k in ("git_commit", "attnbench_version", "torch_version")
               if k in here and state["meta"].get(k) != here[k]]
    note = f"note: the checkpoint was written by another version: {', '.join(differs)}" if differs else ""
    chosen = state["selection"]["weights"] if weights == "selected" else None
    if weights == "selected" and chosen is None:
        note += ("; " if note else "") + "the checkpoint holds no selected weights (the protocol reports the last): the last weights"
    device = select_device(str(cfg.trainer.device))
    with plugins_named(path, needed):
        task = build_task(cfg)
    seed_everything(int(cfg.seed), bool(cfg.trainer.deterministic))
    task.setup(str(cfg.task.get("protocol", "holdout")))  # the same splits as the run (the holdout split is seeded)
    if split not in task.splits:
        raise UserError(f"the run's task has no '{split}' split (it has {', '.join(sorted(task.splits))})")
    seed_everything(int(cfg.seed), bool(cfg.trainer.deterministic))
    with plugins_named(path, needed):
        model = task.build_model(cfg.model).to(device)
    missing, unexpected = _key_difference(model.state_dict(), chosen or state["model"])
    if missing or unexpected:
        raise UserError(f"checkpoint {path} does not fit the model this code builds from its config: "
                        f"missing {', '.join(missing[:3]) or 'nothing'}, unexpected {', '.join(unexpected[:3]) or 'nothing'}"
                        + (f" ({note[6:]})" if note else ""))
    try:
        model.load_state_dict(chosen or state["model"])
    except RuntimeError as e:
        raise UserError(f"checkpoint {path} does not fit the model this code builds from its config: "
                        f"{str(e).strip().splitlines()[-1].strip()[:200]}") from None
    with torch.no_grad():
        metrics = Trainer(cfg.trainer, task, model, device, int(cfg.seed)).evaluate(split)
    return metrics, note


def made_with(meta: dict, cfg) -> list[str]:
    """The plugin modules the checkpoint's run had (its ``meta.plugins``, its config's ``plugins``):
    names only, never imported from here."""
    from omegaconf import OmegaConf

    from bench_cli.config.plugins import names_in

    stored = meta.get("plugins")
    named = OmegaConf.select(cfg, "plugins", default=None)
    modules = []
    for value in (stored, named):
        if isinstance(value, str) or OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
            modules += [m for m in names_in(value) if m not in modules]
    return modules


@contextmanager
def plugins_named(path: Path, needed: list[str]):
    """Building the run's task or model: an attention or task this process does not know, from a
    plugin the user has not named, is one line naming the modules to pass."""
    from bench_cli.config import plugins
    from bench_cli.core.errors import UserError, first_line

    try:
        yield
    except UserError as e:  # the registries' unknown-name line (bench_cli/core/registry.py)
        if not str(e).startswith(("unknown task", "unknown attention")):
            raise
        loaded = {p.module for p in plugins.loaded()}
        missing = [m for m in needed if m not in loaded]
        what = first_line(e).strip("'\"").split(";")[0]
        if missing:
            raise UserError(f"checkpoint {path} was made with plugin {', '.join(missing)}: {what} here; name it: "
                            f"{plugins.PLUGINS_ENV}={','.join(missing)} attnbench evaluate ..., or plugins=[{','.join(missing)}] "
                            "(a checkpoint's own names are never imported)") from None
        raise UserError(f"checkpoint {path}: {what} (made by a plugin? name its module in {plugins.PLUGINS_ENV} "
                        "or plugins=[MODULE])") from None


def _key_difference(expected: dict, given: dict) -> tuple[list[str], list[str]]:
    return sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
