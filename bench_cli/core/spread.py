"""A measurement's spread: the median of repeated measurements with its interquartile range, the
ratio of two series measured round by round, and how a table shows them (torch-free: reports use
it too). Timing itself is bench_cli.engine.timing.time_rounds."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

NOISY_SPREAD = 0.10  # IQR / median above this: the time is noise, not a property of the model
NOISY_NOTE = "noisy: rerun on an idle machine"


def quartiles(values: list[float]) -> tuple[float, float]:
    """(Q1, Q3), inclusive method (one value: itself twice)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


MIN_SPREAD_N = 3  # fewer measurements than this have no interquartile range worth printing


@dataclass(frozen=True)
class Spread:
    """The median of ``n`` measurements and their interquartile range [q1, q3]."""

    median: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        q1, q3 = quartiles(list(values))
        return cls(statistics.median(values), q1, q3, len(values))

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative(self) -> float:
        """IQR / median (0 for a zero median)."""
        return self.iqr / abs(self.median) if self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.relative > NOISY_SPREAD

    def scaled(self, factor: float) -> Spread:
        """The spread of ``factor / x`` for a positive factor (a rate from a time: samples/s): its
        quartiles swap ends."""
        return Spread(factor / self.median, factor / self.q3, factor / self.q1, self.n)

    def columns(self, name: str, digits: int = 6) -> dict:
        """``{name: median, name_q1: q1, name_q3: q3}`` for a record or a CSV row; the quartiles
        empty under MIN_SPREAD_N times (one timed round has no spread: not an interval of width 0)."""
        known = self.n >= MIN_SPREAD_N
        return {name: round(self.median, digits), f"{name}_q1": round(self.q1, digits) if known else None,
                f"{name}_q3": round(self.q3, digits) if known else None}

    def text(self, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
        """'1.23 [1.10-1.31]': the median and its IQR."""
        return (f"{fmt.format(self.median * scale)} [{fmt.format(self.q1 * scale)}-"
                f"{fmt.format(self.q3 * scale)}]")


def ratio_spread(a: list[float], b: list[float]) -> Spread:
    """The per-round ratios a / b (rounds measured together) as a median with its IQR."""
    return Spread.of([x / y for x, y in zip(a, b) if y])


def interval_text(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    """'1.23 [1.10-1.31]' from a row's ``key`` and its ``key_q1``/``key_q3`` (the value alone when the
    row has no quartiles, '-' when it has no value); numbers may be strings (a CSV's)."""
    def num(k):
        try:
            v = row.get(k)
            return None if v in (None, "") else float(v)
        except (TypeError, ValueError):
            return None

    value, q1, q3 = num(key), num(f"{key}_q1"), num(f"{key}_q3")
    if value is None:
        return "-"
    if q1 is None or q3 is None:
        return fmt.format(value)
    return f"{fmt.format(value)} [{fmt.format(q1)}-{fmt.format(q3)}]"
