"""`attnbench bench-cli` (`make bench-cli`): how long the commands that must answer at once take,
next to ``python -c "import torch"`` measured in the same run (`--help`, `ls`, the
listings and a misspelt override at most 0.4x of it; `validate` of the default config at most
1.5 s more than it). A benchmark, not a test: it prints the table and exits 0.

Every command runs as a user runs it (the console script, a fresh process), ``--repeat`` times;
the commands take turns round by round, so load from other processes falls on all of them alike,
and each one's best time is reported (the least disturbed).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_cli.config.args import parse

REFERENCE = ("import torch", [sys.executable, "-c", "import torch"])
QUICK_LIMIT = 0.4  # x import torch: --help, ls, a misspelt override
VALIDATE_EXTRA_S = 1.5  # s over import torch: validate of the default config
# (label, attnbench arguments, limit kind). A misspelt override is refused before anything runs.
COMMANDS = [
    ("--help", ["--help"], "quick"),
    ("ls", ["ls"], "quick"),
    ("ls models", ["ls", "models"], "quick"),
    ("ls tasks", ["ls", "tasks"], "quick"),
    ("ls experiments", ["ls", "experiments"], "quick"),
    ("ls datasets", ["ls", "datasets"], "quick"),
    ("ls runs", ["ls", "runs"], "quick"),
    ("run modle=softmax", ["run", "modle=softmax"], "quick"),
    ("run task=uae", ["run", "task=uae"], "quick"),
    ("validate", ["validate"], "validate"),
]


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    return time.perf_counter() - start


def measure(repeat: int) -> dict[str, list[float]]:
    """Seconds of each command (and the reference) per round, the commands taking turns."""
    script = str(Path(sys.executable).with_name("attnbench"))
    argvs = {REFERENCE[0]: REFERENCE[1], **{label: [script, *args] for label, args, _ in COMMANDS}}
    times: dict[str, list[float]] = {label: [] for label in argvs}
    for _ in range(repeat):
        for label, argv in argvs.items():
            times[label].append(time_once(argv))
    return times


def limit_of(kind: str, torch_s: float) -> float:
    return QUICK_LIMIT * torch_s if kind == "quick" else torch_s + VALIDATE_EXTRA_S


def rows_of(times: dict[str, list[float]]) -> list[list[str]]:
    torch_s = min(times[REFERENCE[0]])
    rows = [[f'python -c "{REFERENCE[0]}"', f"{torch_s:.2f}", f"{statistics.median(times[REFERENCE[0]]):.2f}",
             "1.00x", "-", "reference"]]
    for label, _, kind in COMMANDS:
        best = min(times[label])
        limit = limit_of(kind, torch_s)
        rows.append([f"attnbench {label}", f"{best:.2f}", f"{statistics.median(times[label]):.2f}",
                     f"{best / torch_s:.2f}x", f"{limit:.2f}", "ok" if best <= limit else "[red]over[/]"])
    return rows


def main(args: list[str]) -> None:
    from bench_cli.core.ui import console, show_table

    p = parse("bench-cli", args, {"--repeat": True}, positional=False)
    if p.overrides:
        from bench_cli.core.errors import UserError

        raise UserError(f"usage: attnbench bench-cli [--repeat N]; got '{p.overrides[0]}'")
    repeat = int(p.get("--repeat", 3))
    console.print(f"timing {len(COMMANDS)} commands and `import torch`, {repeat} rounds (cpu count "
                  f"{os.cpu_count()}, load {os.getloadavg()[0]:.1f})", soft_wrap=True)
    show_table("commands that answer at once (seconds, best of the rounds)",
               ["command", "best s", "median s", "x torch", "limit s", ""], rows_of(measure(repeat)),
               caption=f"limits: {QUICK_LIMIT}x import torch; validate: import torch + {VALIDATE_EXTRA_S} s")
