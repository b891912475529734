"""Where one process's time goes, for `attnbench bench-overhead`: named wall-clock durations of the
stages of a run (composition, data, model, training, measurement, record) and the process's age
since exec, read from the kernel, so that the time before ``main`` (the interpreter and the
imports) is counted too. Costs two ``perf_counter`` calls per stage."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

from bench_cli.core.processes import process_start


class Phases:
    """Seconds per named stage of this process (a stage entered twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def forget(self, *names: str) -> None:
        """Start ``names`` afresh (a sweep worker runs job after job in one process)."""
        for name in names:
            self.seconds.pop(name, None)

    def mark(self, name: str, seconds: float | None) -> None:
        if seconds is not None:
            self.seconds[name] = seconds

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}


def process_age_s() -> float | None:
    """Seconds since this process was exec'd (Linux: /proc, 10 ms resolution); None elsewhere."""
    started = process_start()  # clock ticks since boot
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(started) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, TypeError):
        return None


PHASES = Phases()  # this process's stages: the CLI and the runner mark them, bench-overhead reads them
