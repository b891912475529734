"""`attnbench evaluate CHECKPOINT`: the weights of a job's checkpoint (bench_cli/engine/checkpoint.py)
evaluated on a split with the run's own config (stored in the checkpoint), the metrics printed.

The weights are the selected ones when the checkpoint holds them (the protocol's reported
weights: the best validation evaluation of a holdout run), else the last ones; ``--weights last``
takes the last. A checkpoint written by another code version says so in one line; one whose
weights do not fit the model this code builds from its config says what differs in one line.
"""
from __future__ import annotations

from pathlib import Path

USAGE = """\
usage: attnbench evaluate CHECKPOINT [--split test|val|train] [--weights selected|last] [paths.data_root=DIR]

Evaluates the weights of a checkpoint (checkpoints/<job_key>/ckpt-N.pt beside the records file; an
ok job's is kept with trainer.checkpoint.keep_final=true) with the run's own config, and prints
the metrics of the split. --weights selected (default): the evaluation the protocol selected, when
the checkpoint holds its weights; last: the weights of the last step.
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
        if key.split(".")[0] not in ("paths", "trainer") or not _:
            raise UserError(f"evaluate takes only paths.* and trainer.* overrides (the run's config is the checkpoint's): {override}")
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    plugins.import_configured(cfg)
    here = {k: str(v) for k, v in provenance().items() if k in state["meta"]}
    differs = [f"{k} {state['meta'][k]} (here {here[k]})" for k in ("git_commit", "attnbench_version", "torch_version")
               if k in here and state["meta"].get(k) != here[k]]
    note = f"note: the checkpoint was written by another version: {', '.join(differs)}" if differs else ""
    chosen = state["selection"]["weights"] if weights == "selected" else None
    if weights == "selected" and chosen is None:
        note += ("; " if note else "") + "the checkpoint holds no selected weights (the protocol reports the last): the last weights"
    device = select_device(str(cfg.trainer.device))
    task = build_task(cfg)
    seed_everything(int(cfg.seed), bool(cfg.trainer.deterministic))
    task.setup(str(cfg.task.get("protocol", "holdout")))  # the same splits as the run (the holdout split is seeded)
    if split not in task.splits:
        raise UserError(f"the run's task has no '{split}' split (it has {', '.join(sorted(task.splits))})")
    seed_everything(int(cfg.seed), bool(cfg.trainer.deterministic))
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


def _key_difference(expected: dict, given: dict) -> tuple[list[str], list[str]]:
    return sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
