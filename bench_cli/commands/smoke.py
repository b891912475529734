"""`attnbench smoke` (`make smoke-gpu`): every family once on every visible CUDA device, before a
GPU machine is trusted with a reproduction.

The plan (:func:`plan`) is a list of checks, each an `attnbench` command run in its own process,
as a user runs it, so one failing check (a CUDA error, an out-of-memory) cannot take the others
down: per device, one short training run of each family's smallest real configuration in float32
and under autocast (bf16 where the device has it, else fp16), a Primal-Attention model whose KSVD
term runs under half-precision autocast, `attnbench profile` with CUDA timing, and with 2+ devices
a 2-process NCCL DDP run through torchrun.

The data comes first (:func:`gather_data`): a family whose data is a small download is fetched
(`attnbench data`); one whose data is a multi-GB release or a by-hand copy (LRA retrieval and
Pathfinder, DeiT's ImageNet, WikiText-103) is only looked for under the data root. A family whose
data is not there and cannot be fetched (a node without internet) trains a few steps on synthetic
inputs of its shapes instead, and its lines say so; with ``--require-data`` it is one failed
check naming where its files go. ``--data-root DIR`` is the data root of every check.

A failed check's reason is the run's own error: the ``error`` column of the record it appended
(the exception's type and message), else the one ``error:`` line its command printed; never
merely the last line of its output (on CUDA that was the source line of a warning).

On the CPU (``--device cpu``; the test suite runs this plan in-process, tests/test_smoke_plan.py)
every check is smaller: 2 optimiser steps, batches of 2, subsets of 32/16/16 samples (CPU_SUBSETS), LRA
Text and Retrieval at 256 bytes, UEA, TSER and the KSVD check with one encoder layer (ONE_LAYER), DeiT
at 32 pixels and 2 blocks, nmt decoding 10 tokens, nmt, lm (2 layers) and d4rl 128 wide (CPU_NARROW),
d4rl's rollouts 20 steps; float32 and bf16 (the trainer refuses fp16 on the CPU).

Each check prints one line (ok, or failed and its reason); the records go to ``<out>/records.csv``
and ``<out>/profile.csv`` (not results/runs.csv), the check lines to ``<out>/checks.csv``. Exit
status 1 when a check fails, 2 (one line) when there is no CUDA device.
"""
from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Mapping

from bench_cli.core.errors import UserError

# Every check: a few optimiser steps, one evaluation on capped splits, quiet, no logger.
STEPS = ("trainer.max_steps=4", "trainer.eval_every_steps=4", "trainer.batch_size=8", "trainer.eval_batch_size=32",
         "trainer.progress=false", "trainer.num_workers=0", "logger=none", "seed=0")
SUBSETS = ("task.subset.train=64", "task.subset.val=32", "task.subset.test=32")
# On the CPU the same code paths in less time: 2 optimiser steps (and one evaluation after them),
# smaller batches and evaluation splits. A stratified subset keeps one sample of a class only where
# it has two (tasks/data.py stratified_split), so a split must keep more samples than it has classes:
# 32 training samples of 10 classes (3 each, the holdout takes one of each to validate on), 16 to
# validate and test on.
CPU_STEPS = ("trainer.max_steps=2", "trainer.eval_every_steps=2", "trainer.batch_size=2", "trainer.eval_batch_size=8")
# The widest families narrower on the CPU, their structure kept: bf16 matrix products are emulated on a
# CPU without bf16 units (AVX2), where nmt's 1024 wide layers, DeiT's 12 blocks and the Decision
# Transformer's 256 wide ones were most of the plan's time.
CPU_NARROW = ("task.backbone.d_model=128", "task.backbone.d_ff=256")
CPU_SUBSETS = ("task.subset.train=32", "task.subset.val=16", "task.subset.test=16")
# ImageNet-100: two training images of each of its 100 classes (one of them validates); its
# validation split of 100 (one per class) is kept whole: any fewer would leave it empty.
IMAGENET100 = ("task.dataset=imagenet100", "task.subset.train=200", "task.subset.val=100", "task.subset.test=32")
SHORT_BYTES = ("task.max_len=256", "task.seq_len=256")  # LRA Text, Retrieval: 4K bytes took 228 s on the CPU
# Short generated ListOps in a folder of its own (a user's listops_generated keeps its options).
LISTOPS = ("task.dataset=listops_generated", "task.max_len=128", "task.seq_len=128",
           "paths.data_root='${oc.env:ATTNBENCH_DATA,${attnbench_cache:data}}/smoke_listops'",
           *(f"+task.generator.{k}={v}" for k, v in
             {"num_train": 64, "num_val": 32, "num_test": 32, "min_length": 50, "max_length": 120}.items()))


@dataclass(frozen=True)
class Family:
    """A family's smallest real configuration; ``data``: the `attnbench data` arguments that put its
    data in place (None: shipped in a package, or too large to fetch in a smoke check: only looked
    for); ``cpu``: what makes it smaller on the CPU (shorter sequences, smaller splits)."""

    task: str
    overrides: tuple[str, ...] = ()
    data: tuple[str, ...] | None = None
    cpu: tuple[str, ...] = ()


# The time-series tasks evaluate their whole test splits (they have no task.subset): on the CPU one
# encoder layer of their three (JapaneseVowels' 370 test series took most of its bf16 check there)
ONE_LAYER = ("task.backbone.n_layers=1",)
FAMILIES = (
    Family("uea", ("task.dataset=JapaneseVowels",), cpu=ONE_LAYER),
    Family("tser", ("task.dataset=Covid3Month",), cpu=ONE_LAYER),
    # one generator process: 128 expressions are written before a pool of workers has started
    Family("lra_listops", LISTOPS + SUBSETS,
           ("lra_listops", "listops_generated", "--generate", "--workers=1", "task=lra_listops", *LISTOPS),
           CPU_SUBSETS),
    Family("lra_image", SUBSETS, ("lra_image", "cifar10"), CPU_SUBSETS),
    Family("lra_text", SUBSETS, ("lra_text", "imdb"), CPU_SUBSETS + SHORT_BYTES),
    Family("lra_retrieval", SUBSETS, cpu=CPU_SUBSETS + SHORT_BYTES),
    Family("lra_pathfinder", SUBSETS, cpu=CPU_SUBSETS),
    Family("vit", ("task.dataset=mnist5k",) + SUBSETS, cpu=CPU_SUBSETS),
    Family("deit", IMAGENET100, cpu=("task.backbone.image_size=32", "task.backbone.n_layers=2")),
    Family("textcls", ("task.dataset=imdb",) + SUBSETS, ("textcls", "imdb"), CPU_SUBSETS),
    # greedy decoding for BLEU is most of nmt's time on the CPU: 10 tokens instead of 20
    Family("nmt", ("task.dataset=anki",) + SUBSETS, ("nmt", "anki"), CPU_SUBSETS + ("task.seq_len=10",) + CPU_NARROW),
    # on the CPU 2 layers of 128 (6 of 512 took 10 s a backward pass in bf16 on an AVX2-only CPU, whose
    # bf16 matrix products are emulated)
    Family("lm", ("task.subset.train=20000", "task.subset.valid=4096", "task.subset.test=4096"),
           cpu=("task.backbone.n_layers=2", *CPU_NARROW)),
    Family("d4rl", ("task.dataset=hopper-medium-v2", "task.eval.test_episodes=2", "task.eval.val_episodes=1",
                    "task.eval.max_episode_steps=50"), ("d4rl", "hopper-medium-v2"), ("task.eval.max_episode_steps=20", *CPU_NARROW)),
)


@dataclass(frozen=True)
class Check:
    name: str                       # "uea bf16 cuda:0": what the line and checks.csv show
    argv: tuple[str, ...]           # the attnbench command (after `attnbench`)
    launcher: tuple[str, ...] = ()  # what runs the command (torchrun for DDP); default: this Python's CLI
    records: Path | None = None     # the records file its run appends to (its error is read there)
    note: str = ""                  # the reason column of an ok check (why it trained on synthetic inputs)
    absent: str = ""                # why it cannot run (its data, under --require-data): failed unrun


CLI = (sys.executable, "-m", "bench_cli.cli")
SYNTHETIC = (sys.executable, "-m", "bench_cli.commands.smoke")  # runs ``synthetic_steps`` in its own process


def half_precision(device: str) -> str:
    """The autocast dtype a device trains in: bf16 where supported, else fp16 (pre-Ampere GPUs)."""
    if device.startswith("cuda"):
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"


def plan(devices: list[str], out: Path, families=FAMILIES, missing: Mapping[str, str] | None = None,
         require_data: bool = False) -> list[Check]:
    """The checks on ``devices`` ("cuda:0", ... or "cpu"). ``missing``: {task: why its data is not
    there} (:func:`gather_data`): such a family trains on synthetic inputs, or with
    ``require_data`` is one failed check giving that reason."""
    missing = missing or {}
    records, profile = out / "records.csv", out / "profile.csv"
    checks = [Check(f"{f.task} data", (), absent=missing[f.task]) for f in families
              if require_data and f.task in missing]
    families = [f for f in families if not (require_data and f.task in missing)]
    for device in devices:
        half = half_precision(device)
        common = (*overriding(STEPS, CPU_STEPS if device == "cpu" else ()), f"trainer.device={device}",
                  f"results.path={records}")
        for family in families:
            checks += family_checks(family, device, ("32", half), common, records, missing.get(family.task))
        checks.append(Check(f"primal KSVD {half} {device}",
                            ("run", "task=uea", "task.dataset=JapaneseVowels", "model=primalformer", *common,
                             *(ONE_LAYER if device == "cpu" else ()), f"trainer.precision={half}"), records=records))
        checks.append(Check(f"profile timing {device}",
                            profile_command(("task=uea", "model=softmax", f"trainer.device={device}",
                                             "trainer.progress=false"), profile)))
    cuda = [d for d in devices if d.startswith("cuda")]
    if len(cuda) >= 2:
        checks.append(Check("ddp nccl 2 processes", ("run", "task=uea", "task.dataset=JapaneseVowels", *STEPS,
                                                     "trainer.device=cuda", "trainer.strategy=ddp",
                                                     f"results.path={records}"),
                            launcher=(sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc_per_node", "2", "-m", "bench_cli.cli"), records=records))
    return checks


def overriding(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """The overrides of ``groups`` in order, a later value of a key replacing the earlier one in
    its place (the CPU's batch size instead of the GPU's: one value each on the command line)."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged[override.split("=", 1)[0]] = override
    return tuple(merged.values())


def family_checks(family: Family, device: str, precisions: tuple[str, ...], common: tuple[str, ...], records: Path,
                  missing: str | None) -> list[Check]:
    """One check per precision: a run on the family's data, or without it (``missing`` says why)
    a few steps on synthetic inputs of its shapes."""
    checks = []
    for precision in precisions:
        name = f"{family.task} {precision} {device}"
        base = (f"task={family.task}", *overriding(family.overrides, family.cpu if device == "cpu" else ()),
                *common, f"trainer.precision={precision}")
        if missing is None:
            checks.append(Check(name, ("run", *base), records=records))
        else:
            checks.append(Check(name + " (synthetic inputs)", ("synthetic", *base), launcher=SYNTHETIC,
                                note=f"no data: {missing}"))
    return checks


def synthetic_steps(overrides: list[str], steps: int = 3, seq_len: int = 128, batch_size: int = 2) -> float:
    """A few optimiser steps of the configured model on the task's synthetic inputs (its shapes at
    ``seq_len``), in ``trainer.precision`` as the trainer runs it (autocast; fp16 with a
    GradScaler); the last loss, which must be finite. For families whose data is not at hand."""
    import torch

    from bench_cli.config import compose
    from bench_cli.engine.counting import call_model as _call
    from bench_cli.engine.objective import Objective
    from bench_cli.config.taskfit import build_task
    from bench_cli.engine.env import autocast, seed_everything, select_device

    cfg = compose.compose(overrides)
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


# --- running a check ----------------------------------------------------------------------------
Execute = Callable[[Check, float], "tuple[int, str]"]  # (exit status, what the command printed)


def in_subprocess(check: Check, timeout: float) -> tuple[int, str]:
    """The check's command in a process of its own, as a user runs it (what `attnbench smoke` does)."""
    env = {**os.environ, "ATTNBENCH_MADE_BY": "attnbench smoke"}
    r = subprocess.run([*(check.launcher or CLI), *check.argv], capture_output=True, text=True, timeout=timeout,
                       env=env)
    return r.returncode, r.stdout + r.stderr


def in_process(check: Check, timeout: float) -> tuple[int, str]:
    """The check's command through the CLI's entry point (or :func:`main` for synthetic inputs) in
    this process: what the tests run, without the 3 s of imports a process costs. No isolation
    (a crash takes the caller down) and no ``timeout``; a launcher (torchrun) needs processes."""
    from bench_cli.commands.cli import main as cli

    if check.launcher not in ((), SYNTHETIC):
        raise ValueError(f"{check.name}: {check.launcher[2:4]} runs processes; run it with in_subprocess")
    command = main if check.launcher == SYNTHETIC else cli
    printed = io.StringIO()
    with redirect_stdout(printed), redirect_stderr(printed):
        try:
            command(list(check.argv))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
    return code, printed.getvalue()


def run_check(check: Check, timeout: float, execute: Execute = in_subprocess) -> tuple[str, float, str]:
    """(status, seconds, reason) of one check: 'ok' (reason: its note), or 'failed' with the run's
    own error (:func:`failure`)."""
    if check.absent:
        return "failed", 0.0, check.absent
    started = time.monotonic()
    before = record_count(check.records)
    try:
        code, printed = execute(check, timeout)
    except subprocess.TimeoutExpired:
        return "failed", time.monotonic() - started, f"timed out after {timeout:.0f} s"
    seconds = time.monotonic() - started
    if code == 0:
        return "ok", seconds, check.note
    return "failed", seconds, f"exit {code}: {failure(check.records, before, printed)}"


def record_count(records: Path | None) -> int:
    from bench_cli.results.csv_store import read_records

    return len(read_records(records)) if records is not None else 0


def failure(records: Path | None, before: int, printed: str) -> str:
    """Why a check failed: the ``error`` column of the record its run appended after row
    ``before`` of ``records`` (else the exception line of the run folder's error.txt); a command
    that recorded nothing (a mistake found before the run, `profile`, synthetic inputs): the
    ``error:`` line it printed, else its last exception line."""
    from bench_cli.results.csv_store import read_records

    failed = [r for r in (read_records(records)[before:] if records is not None else []) if r.get("status") != "ok"]
    if failed:
        error = failed[-1].get("error") or exception_line(Path(failed[-1].get("output_dir") or ".") / "error.txt")
        if error:
            return error[:500]
    return error_line(printed)


EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def exception_line(path: Path) -> str:
    """The last line of a traceback file that names an exception ("KeyError: 'bleu'"), or ''."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(lines) if EXCEPTION.match(ln.strip())), "")


def error_line(printed: str) -> str:
    """What a command that recorded nothing said was wrong: its last ``error:`` line (the CLI's
    one-line errors), else the last line naming an exception, else its last line."""
    lines = [ln.strip() for ln in printed.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):  # whole: it says where the files go
            return line[len("error:"):].strip()
    return next((ln for ln in reversed(lines) if EXCEPTION.match(ln)), lines[-1] if lines else "")[:500]


# --- the data -------------------------------------------------------------------------------------
def gather_data(families, execute: Execute = in_subprocess, timeout: float = 600) -> dict[str, str]:
    """{task: why its data is not there} of the families whose data is neither under the data root
    nor in a package: a small download is fetched first (`attnbench data`; on a node without
    internet its one line, which names where the files go), a large one only looked for."""
    missing = {}
    for family in families:
        reason = data_missing(family)
        if reason and family.data:
            try:
                code, printed = execute(Check(f"{family.task} data", ("data", *family.data)), timeout)
                reason = error_line(printed) if code else None
            except subprocess.TimeoutExpired:
                reason = f"`attnbench data {' '.join(family.data[:2])}` timed out after {timeout:.0f} s"
        if reason:
            missing[family.task] = reason
    return missing


def data_missing(family: Family) -> str | None:
    """None when the family's dataset is under the data root or in a package (its fetcher's
    answer, which never downloads); else the fetcher's line saying where the files go."""
    from bench_cli.config import compose
    from attnbench.tasks import task_class
    from attnbench.tasks.fetch import fetcher

    cfg = compose.compose([f"task={family.task}", *family.overrides])
    cls, data_root, dataset = task_class(family.task), Path(cfg.paths.data_root).expanduser(), str(cfg.task.dataset)
    source = fetcher(cls.fetcher)
    if source.status(dataset, data_root) in ("local", "package"):
        return None
    return source.missing_message(dataset, data_root, **cls(cfg.task, data_root).data_options())


# --- the command ----------------------------------------------------------------------------------
def visible_devices(device: str) -> list[str]:
    """The devices to check: every CUDA device, or the CPU when asked; no CUDA is a UserError."""
    if device == "cpu":
        return ["cpu"]
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise UserError("no CUDA device is visible (torch.cuda.is_available() is False): the GPU smoke check "
                        "needs one; `attnbench smoke --device cpu` runs its plan on the CPU")
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def write_checks(path: Path, rows: list[dict]) -> None:
    from bench_cli.core.files import write_atomically

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["check", "status", "seconds", "reason"])
    w.writeheader()
    w.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, buf.getvalue())


def smoke(devices: list[str], out: Path, families=FAMILIES, *, require_data: bool = False, timeout: float = 600,
          execute: Execute | None = None) -> list[dict]:
    """The data, then the plan's checks one by one, a line each; the rows of ``<out>/checks.csv``.
    ``execute``: how a command runs (default :func:`in_subprocess`)."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    execute = execute or in_subprocess
    missing = gather_data(families, execute, timeout)
    for task, reason in missing.items():
        then = "a failed check (--require-data)" if require_data else "its checks train on synthetic inputs"
        console.print(f"[yellow]no data[/] {task}: {escape(reason)}; {then}", highlight=False, soft_wrap=True)
    rows = []
    for check in plan(devices, out, families, missing, require_data):
        status, seconds, reason = run_check(check, timeout, execute)
        colour = "green" if status == "ok" else "red"
        shown = "" if status == "ok" and check.note else reason  # the note was the family's line above
        console.print(f"[{colour}]{status:6}[/] {escape(check.name)}  ({seconds:.1f} s)"
                      f"{'  ' + escape(shown) if shown else ''}", highlight=False, soft_wrap=True)
        rows.append({"check": check.name, "status": status, "seconds": f"{seconds:.1f}", "reason": reason})
        write_checks(out / "checks.csv", rows)  # after every check: an interrupted smoke keeps its lines
    return rows


OPTIONS = ("--device cuda|cpu, --only TASK[,TASK...], --out DIR, --timeout SECONDS, --data-root DIR, "
           "--require-data")


def cmd_smoke(args: list[str]) -> None:
    from bench_cli.config.args import parse

    from bench_cli.core.errors import unknown_choice
    from bench_cli.core.ui import console

    p = parse("smoke", args, {"--device": True, "--only": True, "--out": True, "--timeout": True,
                              "--data-root": True, "--require-data": False}, positional=False)
    if p.overrides:
        raise UserError(f"`attnbench smoke` takes no overrides ({p.overrides[0]}); options: {OPTIONS}")
    device = str(p.get("--device", "cuda"))
    if device not in ("cuda", "cpu"):
        raise unknown_choice("--device", device, ["cuda", "cpu"])
    families = FAMILIES
    if p.get("--only"):
        known = {f.task: f for f in FAMILIES}
        for n in str(p.get("--only")).split(","):
            if n not in known:
                raise unknown_choice("family", n, known)
        families = tuple(known[n] for n in str(p.get("--only")).split(","))
    try:
        timeout = float(p.get("--timeout", 600))
    except ValueError:
        raise UserError(f"--timeout takes seconds, not '{p.get('--timeout')}'") from None
    if p.get("--data-root"):
        data_root = Path(str(p.get("--data-root"))).expanduser().resolve()
        if not data_root.is_dir():
            raise UserError(f"--data-root {p.get('--data-root')}: no such folder (it holds the datasets as "
                            f"`attnbench ls datasets paths.data_root=DIR` lists them)")
        os.environ["ATTNBENCH_DATA"] = str(data_root)  # every check's data root, and this process's
    out = Path(str(p.get("--out", "results/smoke")))
    devices = visible_devices(device)
    rows = smoke(devices, out, families, require_data=bool(p.get("--require-data")), timeout=timeout)
    failed = sum(r["status"] != "ok" for r in rows)
    synthetic = sorted({r["check"].split()[0] for r in rows if r["check"].endswith("(synthetic inputs)")})
    console.print(f"smoke: {len(rows) - failed} of {len(rows)} checks ok on {', '.join(devices)}"
                  + (f"; synthetic inputs for {', '.join(synthetic)} (their data is not here: `attnbench ls "
                     f"datasets` says where it goes)" if synthetic else "")
                  + f"; records in {out}/records.csv, {out}/profile.csv; lines in {out}/checks.csv",
                  highlight=False, soft_wrap=True)
    if failed:
        raise SystemExit(1)


def main(argv: list[str]) -> None:
    """``python -m bench_cli.commands.smoke synthetic OVERRIDES...``: one synthetic-input check, one
    line; a failure is one ``error:`` line with the exception's type and message, exit 1."""
    from bench_cli.core.ui import fail

    if not argv or argv[0] != "synthetic":
        fail("usage: python -m bench_cli.commands.smoke synthetic [overrides...]")
    try:
        loss = synthetic_steps(argv[1:])
    except UserError as e:
        fail(str(e), code=1)
    except Exception as e:  # noqa: BLE001 - the check's one line: what failed, not a traceback
        fail(f"{type(e).__name__}: {e}".splitlines()[0], code=1)
    print(f"ok: loss {loss:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
