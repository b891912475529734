"""Sizes a user gives (lengths, batches, widths, repeats) checked before anything is allocated:
each one line (UserError), never a traceback from deep inside an allocation."""
from __future__ import annotations

from bench_cli.core.errors import UserError


def check_at_least(option: str, value: int, minimum: int = 1, command: str = "") -> int:
    """``value`` when it is an integer of at least ``minimum``; else one line naming ``option``."""
    where = f" of `attnbench {command}`" if command else ""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"option {option}{where} must be an integer of at least {minimum} (got {value})")
    return value


def check_heads(d_model: int, heads: int, command: str = "") -> None:
    if d_model % heads:
        where = f"`attnbench {command}`: " if command else ""
        raise UserError(f"{where}--heads {heads} does not divide --d-model {d_model} (each head gets d_model / heads)")


def available_memory_bytes() -> int | None:
    """The memory the system can give this process now (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def dense_attention_bytes(batch: int, heads: int, length: int, d_model: int, bytes_per_value: int = 4) -> int:
    """A lower bound of what a dense attention of these sizes holds at once, forward and backward:
    the scores and their softmax (batch x heads x length^2, twice) and the activations."""
    return bytes_per_value * (2 * batch * heads * length * length + 8 * batch * length * d_model)


def check_fits(what: str, needed: int, advice: str) -> None:
    """Refuse, in one line, what needs more memory than is available (unknown: not refused)."""
    free = available_memory_bytes()
    if free is not None and needed > free:
        raise UserError(f"{what} needs at least {_gib(needed)} of memory, {_gib(free)} is available: {advice}")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
