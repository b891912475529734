"""The one timer of every timing (a run's epochs and inference, `attnbench profile`, `bench`, `bench
--against-reference`, bench-overhead's summaries) and the one timing session around it: the median
with its interquartile range, never one number, and whether the times can be trusted.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import torch

from bench_cli.core.spread import NOISY_NOTE, NOISY_SPREAD, Spread, ratio_spread

__all__ = ["Conditions", "RegionTimer", "Spread", "TimingSession", "load_average", "ratio_spread", "seconds",
           "time_rounds", "timed", "timer_name"]


#
# One timer for every timing (bench, profile, a run's inference and epochs, bench-overhead's
# summaries): the median with its interquartile range, never one number. A ratio model / baseline
# comes from rounds in which each side runs once, the order alternating from round to round, so a
# burst of load hits both sides of a pair; its interval is the IQR of the per-round ratios.
#
# Why not torch.utils.benchmark.Timer.adaptive_autorange: it times one statement alone, block after
# block, so the baseline would be timed minutes apart from the model (its spread says nothing
# about the ratio), it cannot run under profile's per-side time budget (SIGALRM) and its clock is
# not injectable in tests. Its stopping rule is kept: repeat until IQR / median <= precision
# (after a minimum number of rounds) or until the time budget is spent.


class RegionTimer:
    """Seconds of a timed region that may span many calls (a training segment between two
    evaluations). On CUDA, which runs asynchronously, two CUDA events on the device's current
    stream: ``stop`` records the end event and waits for it, once per region, never per step;
    elsewhere wall-clock ``time.perf_counter``. ``timer_name`` says which."""

    def __init__(self, device: torch.device | None = None):
        self.device = device if device is not None and device.type == "cuda" else None

    def start(self) -> None:
        if self.device is not None:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))
        else:
            self._start_s = time.perf_counter()

    def stop(self) -> float:
        if self.device is None:
            return time.perf_counter() - self._start_s
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        end.synchronize()
        return self._start.elapsed_time(end) / 1000.0  # milliseconds


def seconds(fn: Callable[[], Any], device: torch.device | None = None,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of ``fn()``: the one timer of a run's inference timing, `attnbench profile` and
    `make bench`. On CUDA two events around the call (a :class:`RegionTimer`), the device
    synchronised once before it so that work queued earlier does not count; elsewhere ``clock``
    (a fake one in tests)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        timer = RegionTimer(device)
        timer.start()
        fn()
        return timer.stop()
    start = clock()
    fn()
    return clock() - start


def timer_name(device: torch.device | None) -> str:
    """The clock ``seconds`` reads on ``device`` (for the records)."""
    return "CUDA events" if device is not None and device.type == "cuda" else "time.perf_counter"


def time_rounds(steps: list[Callable[[], float | None]], *, min_rounds: int = 5, max_rounds: int = 200,
                precision: float = 0.05, budget_s: float = 2.0, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds of each of ``steps`` per round: ``warmup`` untimed calls of each, then rounds in
    which every step runs once, in order in even rounds and reversed in odd ones, until, after
    ``min_rounds``, the first step's times and every other step's ratios to it have an
    IQR / median <= ``precision``, or ``budget_s`` seconds were spent, or ``max_rounds`` ran.

    A step runs one measurement and returns its seconds (``timed(fn, device)``), or None when it
    could not run (profile's failed side): it then adds no time and is not waited for."""
    for _ in range(warmup):
        for step in steps:
            step()
    times: list[list[float]] = [[] for _ in steps]
    started = clock()
    for i in range(max_rounds):
        order = range(len(steps)) if i % 2 == 0 else reversed(range(len(steps)))
        for j in order:
            t = steps[j]()
            if t is not None:
                times[j].append(t)
        if i + 1 >= min_rounds and (clock() - started >= budget_s or _precise(times, precision)):
            break
    return times


PRECISION_MIN_N = 3  # fewer times have no spread to judge: one round's "IQR" is 0 by construction


def _precise(times: list[list[float]], precision: float) -> bool:
    live = [t for t in times if t]
    if not live:
        return True
    base = live[0]
    if len(base) < PRECISION_MIN_N:
        return False
    return Spread.of(base).relative <= precision and all(
        ratio_spread(t, base).relative <= precision for t in live[1:] if len(t) == len(base))


def timed(fn: Callable[[], Any], device: torch.device | None = None,
          clock: Callable[[], float] = time.perf_counter) -> Callable[[], float]:
    """A step for :func:`time_rounds`: runs ``fn`` once and returns its seconds."""
    return lambda: seconds(fn, device, clock)


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass
class Conditions:
    """What the machine was doing while something was timed: the 1-minute load average before and
    after, the threads torch used and the cores. ``Conditions.now()`` at the start, ``.done()`` at the end."""

    load_before: float | None
    threads: int
    cores: int
    load_after: float | None = None
    one_thread: str = "trainer.num_threads=1"  # how the command's user asks for one thread (the noisy line says it)

    @classmethod
    def now(cls, one_thread: str = "trainer.num_threads=1") -> Conditions:
        return cls(load_average(), torch.get_num_threads(), os.cpu_count() or 1, one_thread=one_thread)

    def done(self) -> Conditions:
        self.load_after = load_average()
        self.threads = torch.get_num_threads()
        return self

    @property
    def overloaded(self) -> bool:
        """Load beyond the cores: before, or after once our own threads are taken out (the
        1-minute average counts them)."""
        before, after = self.load_before or 0.0, (self.load_after or 0.0) - self.threads
        return max(before, after) > self.cores

    def noise(self, spreads: list[Spread] = ()) -> str:
        """'' when the timing can be trusted, else NOISY_NOTE, what else to change, and why: with
        several threads, one thread per process (threads that wait for a descheduled one made the
        default run 6-30x slower on a shared 2-core machine: conf/trainer/default.yaml)."""
        reasons = []
        if self.overloaded:
            reasons.append(f"load {max(self.load_before or 0, self.load_after or 0):.1f} on {self.cores} cores")
        wide = [s for s in spreads if s.noisy]
        if wide:
            reasons.append(f"{len(wide)} time(s) with IQR > {NOISY_SPREAD:.0%} of the median")
        if not reasons:
            return ""
        if self.threads > 1:
            return f"{NOISY_NOTE} or with {self.one_thread} ({self.threads} threads; {'; '.join(reasons)})"
        return f"{NOISY_NOTE} ({'; '.join(reasons)})"

    def columns(self) -> dict:
        """The record's columns of the conditions (bench_cli.results.schema.TIMING_COLUMNS)."""
        r = lambda v: None if v is None else round(v, 2)  # noqa: E731
        return {"load_before": r(self.load_before), "load_after": r(self.load_after), "threads": self.threads}

    def line(self) -> str:
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        return (f"load average (1 min) before {f(self.load_before)}, after {f(self.load_after)}; "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, {self.cores} cores")


class TimingSession:
    """What every timing command does around its timed rounds, said once: the machine's
    ``Conditions`` from ``TimingSession()`` to ``done()``, the spreads it was judged by (``judge``)
    and its verdict ``noise``: '' when the times can be trusted, else why not (it starts with
    NOISY_NOTE). ``columns()`` are a row's ``load_before``, ``load_after``, ``threads`` and
    ``timing_noisy`` (that reason string, empty when trusted: the one meaning of the column in a
    run's record, a profile row and a bench row)."""

    def __init__(self, one_thread: str = "trainer.num_threads=1"):
        self.conditions = Conditions.now(one_thread)
        self.spreads: list[Spread] = []
        self.noise = ""

    def judge(self, spread: Spread) -> Spread:
        """Count ``spread`` (a time, or a ratio of rounds) in the verdict; return it."""
        self.spreads.append(spread)
        return spread

    def done(self) -> TimingSession:
        self.conditions.done()
        self.noise = self.conditions.noise(self.spreads)
        return self

    def columns(self, spreads: list[Spread] = ()) -> dict:
        """The row's columns; ``spreads``: the row's own (a profile row's ratios), judged with the
        session's for this row alone."""
        noise = self.conditions.noise([*self.spreads, *spreads]) if spreads else self.noise
        return {**self.conditions.columns(), "timing_noisy": noise}

    def line(self) -> str:
        return self.conditions.line()
