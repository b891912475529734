"""`attnbench smoke` (`make smoke-gpu`): every family once on every visible CUDA device, before a
GPU machine is trusted with a reproduction (issue 37).

The plan (:func:`plan`) is a list of checks, each an `attnbench` command run in its own process,
as a user runs it, so one failing check (a CUDA error, an out-of-memory) cannot take the others
down: per device, one short training run of each family's smallest real configuration in float32
and under autocast (bf16 where the device has it, else fp16), a Primal-Attention model whose KSVD
term runs under half-precision autocast, `attnbench profile` with CUDA timing, and with 2+ devices
a 2-process NCCL DDP run through torchrun. A family whose data is a small download is fetched
first (`attnbench data`); one whose data is a multi-GB release or a by-hand copy (LRA retrieval and
Pathfinder, DeiT's ImageNet) trains on synthetic inputs of its shapes (`attnbench profile`, one
timed training step per precision) unless the data is already under the data root.

Each check prints one line (ok, or failed and the last line its command printed); the records go
to ``<out>/records.csv`` and ``<out>/profile.csv`` (not results/runs.csv), the check lines to
``<out>/checks.csv``. Exit status 1 when a check fails, 2 (one line) when there is no CUDA device.
``--device cpu`` runs the same plan on the CPU (float32 and bf16; what the tests run).
"""
from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench_cli.core.errors import UserError

# Every check: a few optimiser steps, one evaluation on capped splits, quiet, no logger.
STEPS = ("trainer.max_steps=4", "trainer.eval_every_steps=4", "trainer.batch_size=8", "trainer.eval_batch_size=32",
         "trainer.progress=false", "trainer.num_workers=0", "logger=none", "seed=0")
SUBSETS = ("task.subset.train=64", "task.subset.val=32", "task.subset.test=32")
# Short generated ListOps in a folder of its own (a user's listops_generated keeps its options).
LISTOPS = ("task.dataset=listops_generated", "task.max_len=128", "task.seq_len=128",
           "paths.data_root='${oc.env:ATTNBENCH_DATA,${attnbench_cache:data}}/smoke_listops'",
           *(f"+task.generator.{k}={v}" for k, v in
             {"num_train": 64, "num_val": 32, "num_test": 32, "min_length": 50, "max_length": 120}.items()))


@dataclass(frozen=True)
class Family:
    """A family's smallest real configuration; ``data``: the `attnbench data` arguments that put its
    data in place (None: shipped in a package); ``synthetic``: its data is too large to fetch in a
    smoke check, so it trains on synthetic inputs unless the data is there."""

    task: str
    overrides: tuple[str, ...] = ()
    data: tuple[str, ...] | None = None
    synthetic: bool = False


FAMILIES = (
    Family("uea", ("task.dataset=JapaneseVowels",)),
    Family("tser", ("task.dataset=Covid3Month",)),
    Family("lra_listops", LISTOPS + SUBSETS,
           ("lra_listops", "listops_generated", "--generate", "task=lra_listops", *LISTOPS)),
    Family("lra_image", SUBSETS, ("lra_image", "cifar10")),
    Family("lra_text", SUBSETS, ("lra_text", "imdb")),
    Family("lra_retrieval", SUBSETS, synthetic=True),
    Family("lra_pathfinder", SUBSETS, synthetic=True),
    Family("vit", ("task.dataset=mnist5k",) + SUBSETS),
    Family("deit", ("task.dataset=imagenet100",) + SUBSETS, synthetic=True),
    Family("textcls", ("task.dataset=imdb",) + SUBSETS, ("textcls", "imdb")),
    Family("nmt", ("task.dataset=anki",) + SUBSETS, ("nmt", "anki")),
    Family("lm", ("task.subset.train=20000", "task.subset.valid=4096", "task.subset.test=4096"), synthetic=True),
    Family("d4rl", ("task.dataset=hopper-medium-v2", "task.eval.test_episodes=2", "task.eval.val_episodes=1",
                    "task.eval.max_episode_steps=50"), ("d4rl", "hopper-medium-v2")),
)


@dataclass(frozen=True)
class Check:
    name: str                       # "uea bf16 cuda:0": what the line and checks.csv show
    argv: tuple[str, ...]           # the attnbench command (after `attnbench`)
    prepare: tuple[str, ...] = ()   # an attnbench command run first (the data), skipped when it was run
    launcher: tuple[str, ...] = ()  # what runs the command (torchrun for DDP); default: this Python


SYNTHETIC = (sys.executable, "-m", "bench_cli.commands.smoke")  # runs ``synthetic_steps`` in its own process


def half_precision(device: str) -> str:
    """The autocast dtype a device trains in: bf16 where supported, else fp16 (pre-Ampere GPUs)."""
    if device.startswith("cuda"):
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"


def plan(devices: list[str], out: Path, families=FAMILIES, present=lambda family: True) -> list[Check]:
    """The checks on ``devices`` ("cuda:0", ... or "cpu"); ``present(family)`` says whether a
    synthetic-only family's data is under the data root (then it trains on it)."""
    records, profile = out / "records.csv", out / "profile.csv"
    checks: list[Check] = []
    for device in devices:
        precisions = ("32", half_precision(device))
        common = (*STEPS, f"trainer.device={device}", f"results.path={records}")
        for family in families:
            for precision in precisions:
                name = f"{family.task} {precision} {device}"
                base = (f"task={family.task}", *family.overrides, *common, f"trainer.precision={precision}")
                if family.synthetic and not present(family):
                    checks.append(Check(name + " (synthetic inputs)", ("synthetic", *base), launcher=SYNTHETIC))
                else:
                    checks.append(Check(name, ("run", *base), tuple(("data", *family.data)) if family.data else ()))
        half = precisions[1]
        checks.append(Check(f"primal KSVD {half} {device}",
                            ("run", "task=uea", "task.dataset=JapaneseVowels", "model=primalformer", *common,
                             f"trainer.precision={half}")))
        checks.append(Check(f"profile timing {device}",
                            profile_command(("task=uea", "model=softmax", f"trainer.device={device}",
                                             "trainer.progress=false"), profile)))
    cuda = [d for d in devices if d.startswith("cuda")]
    if len(cuda) >= 2:
        checks.append(Check("ddp nccl 2 processes", ("run", "task=uea", "task.dataset=JapaneseVowels", *STEPS,
                                                     "trainer.device=cuda", "trainer.strategy=ddp",
                                                     f"results.path={records}"),
                            launcher=(sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc_per_node", "2", "-m", "bench_cli.cli")))
    return checks


def synthetic_steps(overrides: list[str], steps: int = 3, seq_len: int = 128, batch_size: int = 2) -> float:
    """A few optimiser steps of the configured model on the task's synthetic inputs (its shapes at
    ``seq_len``), in ``trainer.precision`` as the trainer runs it (autocast; fp16 with a
    GradScaler); the last loss, which must be finite. For families whose data is not at hand."""
    import torch

    from bench_cli.config import compose as C
    from bench_cli.engine.measure import _call
    from bench_cli.engine.objective import Objective
    from bench_cli.config.taskfit import build_task
    from bench_cli.engine.env import autocast, seed_everything, select_device

    cfg = C.compose(overrides)
    device, precision = select_device(str(cfg.trainer.device)), str(cfg.trainer.precision)
    seed_everything(int(cfg.seed), False)
    task = build_task(cfg)
    task.setup_synthetic(seq_len)
    model = task.build_model(cfg.model).to(device)
    batch = task.synthetic_batch(batch_size, seq_len, device)
    inputs, loss_fn = task.model_inputs(batch), Objective.of(task, cfg.model).on(model, batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    model.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = loss_fn(_call(model, inputs))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    value = float(loss.detach())
    if not torch.isfinite(torch.tensor(value)):
        raise UserError(f"loss {value} after {steps} steps in {precision} on {device}")
    return value


def profile_command(overrides: tuple[str, ...], out: Path) -> tuple[str, ...]:
    """`attnbench profile` of the configuration alone (no baseline) at one short length: its model
    built on synthetic inputs, one timed training step (CUDA events on a GPU)."""
    return ("profile", *overrides, "baseline=null", "profile.seq_lens=[128]", "profile.batch_size=2",
            "profile.timing.warmup=1", "profile.timing.repeats=1", "profile.plot=null", f"profile.output={out}")


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_check(check: Check, prepared: set, timeout: float) -> tuple[str, float, str]:
    """(status, seconds, reason) of one check: 'ok' or 'failed' with the last line printed."""
    started = time.monotonic()
    env = {**os.environ, "ATTNBENCH_MADE_BY": "attnbench smoke"}
    try:
        if check.prepare and check.prepare not in prepared:
            r = subprocess.run([sys.executable, "-m", "bench_cli.cli", *check.prepare], capture_output=True,
                               text=True, timeout=timeout, env=env)
            if r.returncode != 0:
                return "failed", time.monotonic() - started, "data: " + last_line(r.stderr or r.stdout)
            prepared.add(check.prepare)
        launcher = check.launcher or (sys.executable, "-m", "bench_cli.cli")
        r = subprocess.run([*launcher, *check.argv], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "failed", time.monotonic() - started, f"timed out after {timeout:.0f} s"
    seconds = time.monotonic() - started
    if r.returncode != 0:
        return "failed", seconds, f"exit {r.returncode}: {last_line(r.stderr or r.stdout)}"
    return "ok", seconds, ""


def visible_devices(device: str) -> list[str]:
    """The devices to check: every CUDA device, or the CPU when asked; no CUDA is a UserError."""
    if device == "cpu":
        return ["cpu"]
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise UserError("no CUDA device is visible (torch.cuda.is_available() is False): the GPU smoke check "
                        "needs one; `attnbench smoke --device cpu` runs its plan on the CPU")
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def data_present(family: Family) -> bool:
    """Whether a synthetic-only family's dataset is under the data root (then it trains on it)."""
    from bench_cli.config import compose as C
    from tasks import task_class

    cfg = C.compose([f"task={family.task}", *family.overrides])
    try:
        task_class(family.task)(cfg.task, cfg.paths.data_root).check_data()
    except UserError:
        return False
    return True


def write_checks(path: Path, rows: list[dict]) -> None:
    from bench_cli.core.files import write_atomically

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["check", "status", "seconds", "reason"])
    w.writeheader()
    w.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, buf.getvalue())


def cmd_smoke(args: list[str]) -> None:
    from bench_cli.config.args import parse
    from rich.markup import escape

    from bench_cli.core.errors import unknown_choice
    from bench_cli.core.ui import console

    p = parse("smoke", args, {"--device": True, "--only": True, "--out": True, "--timeout": True}, positional=False)
    if p.overrides:
        raise UserError(f"`attnbench smoke` takes no overrides ({p.overrides[0]}); options: --device cuda|cpu, "
                        "--only TASK[,TASK...], --out DIR, --timeout SECONDS")
    device = str(p.get("--device", "cuda"))
    if device not in ("cuda", "cpu"):
        raise unknown_choice("--device", device, ["cuda", "cpu"])
    families = FAMILIES
    if p.get("--only"):
        names = str(p.get("--only")).split(",")
        known = {f.task: f for f in FAMILIES}
        for n in names:
            if n not in known:
                raise unknown_choice("family", n, known)
        families = tuple(known[n] for n in names)
    try:
        timeout = float(p.get("--timeout", 600))
    except ValueError:
        raise UserError(f"--timeout takes seconds, not '{p.get('--timeout')}'") from None
    out = Path(str(p.get("--out", "results/smoke")))
    devices = visible_devices(device)
    checks = plan(devices, out, families, data_present)
    rows, prepared = [], set()
    for check in checks:
        status, seconds, reason = run_check(check, prepared, timeout)
        colour = "green" if status == "ok" else "red"
        console.print(f"[{colour}]{status:6}[/] {escape(check.name)}  ({seconds:.1f} s)"
                      f"{'  ' + escape(reason) if reason else ''}", highlight=False, soft_wrap=True)
        rows.append({"check": check.name, "status": status, "seconds": f"{seconds:.1f}", "reason": reason})
        write_checks(out / "checks.csv", rows)  # after every check: an interrupted smoke keeps its lines
    failed = sum(r["status"] != "ok" for r in rows)
    console.print(f"smoke: {len(rows) - failed} of {len(rows)} checks ok on {', '.join(devices)}; "
                  f"records in {out}/records.csv, {out}/profile.csv; lines in {out}/checks.csv", highlight=False,
                  soft_wrap=True)
    if failed:
        raise SystemExit(1)


def main(argv: list[str]) -> None:
    """``python -m bench_cli.commands.smoke synthetic OVERRIDES...``: one synthetic-input check, one line."""
    from bench_cli.core.ui import fail

    if not argv or argv[0] != "synthetic":
        fail("usage: python -m bench_cli.commands.smoke synthetic [overrides...]")
    try:
        loss = synthetic_steps(argv[1:])
    except UserError as e:
        fail(str(e), code=1)
    print(f"ok: loss {loss:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
