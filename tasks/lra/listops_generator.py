"""The ListOps generator of Long Range Arena (Tay et al. 2021, ``lra_benchmarks/data/listops.py``),
re-implemented without TensorFlow/absl so the task can be built offline.

Same distribution as the official generator: operators MAX, MIN, MED, SUM_MOD ('[SM'), values
0-9; a node at depth < max_depth becomes an operator with probability 0.25 (VALUE_P) with
2..max_args arguments, otherwise a value (always a value at max_depth); a tree's length counts its
values, operators and closing brackets; trees are kept when min_length < length < max_length
(strict), de-duplicated, and split in generation order into train / val / test. Defaults are the
official ones (max_depth 10, max_args 10, lengths 500-2000, 96000 / 2000 / 2000 samples).

Output is the release's format: ``<task>_{train,val,test}.tsv`` with a ``Source<TAB>Target``
header, written by ``csv.writer`` with a tab delimiter (so lines end in CRLF, as the release's).
A Source is the bracketed prefix expression, e.g. ``( ( ( [MAX 2 ) 9 ) ] )``; the Target is its
value. MED is ``int(np.median(args))`` (the mean of the two middle values, truncated) and SUM_MOD
is ``sum(args) % 10``, as in the official code.

Differences (by design): the official script draws from an unseeded global RNG and iterates a set
of trees (so the split order is hash order); here the RNG is seeded and the order is generation
order, both equally random partitions but reproducible. A ``generator.json`` beside the files
records the parameters.

At scale (the default 100,000 samples) the examples are streamed to disk as they are made, and
de-duplicated by a 16-byte digest of each Source, so memory stays constant. The work is spread
over worker processes without changing a byte of the output, because the output is a function of
one random stream only:

* the draws are those of one ``random.Random(seed)``: every draw is ``random()`` (two 32-bit words
  of the Mersenne Twister) or ``getrandbits(k <= 32)`` (one word; ``choice``/``randint`` are
  ``getrandbits`` with rejection, as ``Random._randbelow``), so a candidate tree that starts at
  word ``p`` is a function of the words from ``p`` on, and the next candidate starts where it
  ended (``_tree`` counts the words it used);
* the stream is cut into segments of words; a worker starts reading some words before its
  segment (``BURN_IN``) at a position that need not be a tree's start. Its chain of tree starts
  meets the true chain (the one from word 0) after a few thousand words, as two walks over the same
  cards meet in the Kruskal count, and from a common start on the two chains are the same trees;
* the main process keeps only what a worker read from the true chain's first start in the
  segment (the previous segment's end) on; when the chains have not met by then (rare) it reads
  that segment itself from the true start. The result is the sequential generation, exactly,
  whatever the number of workers.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import signal
import sys
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from collections.abc import Callable, Iterator

from bench_cli.core.files import write_atomically

MIN, MAX, MED, FIRST, LAST, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[FIRST", "[LAST", "[SM", "]"
OPERATORS = [MIN, MAX, MED, SUM_MOD]  # the official list (FIRST and LAST are commented out there)
VALUES = range(10)
VALUE_P = 0.25

DEFAULTS = dict(num_train=96000, num_val=2000, num_test=2000, max_depth=10, max_args=10,
                min_length=500, max_length=2000, task="basic", seed=0)

# Words of the random stream per segment: small first (a small set is done after one), doubling up
# to MAX_SEGMENT (about 1,900 default samples, 1-2 s of one core); a worker reads BURN_IN words
# before its segment so that its chain of trees has met the true one (measured: within 40,000).
FIRST_SEGMENT, MAX_SEGMENT, BURN_IN = 1 << 16, 1 << 23, 1 << 17
_DIGITS = [str(v) for v in VALUES]
_OPERATOR_BITS = len(OPERATORS).bit_length()  # Random._randbelow(n) draws n.bit_length() bits


def median_int(args: list[int]) -> int:
    """``int(np.median(args))`` for non-negative ints: the middle value, or the mean of the two
    middle values truncated."""
    s, n = sorted(args), len(args)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def _apply(op: int, args: list[int]) -> int:
    if op == 0:
        return min(args)
    if op == 1:
        return max(args)
    if op == 2:
        return median_int(args)
    return sum(args) % 10


def _tree(random_, getrandbits, max_depth: int, max_args: int, out: list) -> tuple[int, int, int]:
    """Append the tokens of one random tree to ``out``; return (length, value, words drawn).

    The draws of the official ``generate_tree``, in its order: per node ``random()`` (not at
    max_depth), then a value ``choice(VALUES)``, or ``randint(2, max_args)`` arguments, the
    arguments, and the operator ``choice(OPERATORS)`` last. ``choice(seq)`` and ``randint`` are
    ``Random._randbelow(n)``: ``getrandbits(n.bit_length())`` until below n. ``random()`` draws 2
    words of the stream, ``getrandbits(k <= 32)`` one."""
    if 1 < max_depth and random_() <= VALUE_P:
        length, value, words = _operator(random_, getrandbits, 1, max_depth, max_args, out)
        return length, value, words + 2
    value, words = getrandbits(4), (3 if 1 < max_depth else 1)  # a value at the root: as in _operator
    while value >= 10:
        value, words = getrandbits(4), words + 1
    out.append(_DIGITS[value])
    return 1, value, words


def _operator(random_, getrandbits, depth: int, max_depth: int, max_args: int, out: list) -> tuple[int, int, int]:
    """An operator node at ``depth`` whose ``random()`` the caller drew; its values (leaves) are
    drawn inline, the hot path (3 nodes in 4 are values)."""
    width = max_args - 1  # randint(2, max_args) = 2 + _randbelow(max_args - 1)
    bits = width.bit_length()
    n, words = getrandbits(bits), 1
    while n >= width:
        n, words = getrandbits(bits), words + 1
    n += 2
    # Source: n + 1 "(", the operator, "arg )" per argument, "] )": to_string of the left-nested
    # pairs (((op, a0), a1) ..., END) the official code builds.
    out.extend(["("] * (n + 1))
    at = len(out)
    out.append(None)  # the operator, drawn after the arguments
    length, values = 2, []
    child = depth + 1
    draw = child < max_depth  # at max_depth a node is a value without a random() draw
    for _ in range(n):
        if draw and random_() <= VALUE_P:
            sub_length, value, sub_words = _operator(random_, getrandbits, child, max_depth, max_args, out)
            length, words = length + sub_length, words + sub_words + 2
        else:
            value, words = getrandbits(4), words + (3 if draw else 1)  # _randbelow(10): 4 bits
            while value >= 10:
                value, words = getrandbits(4), words + 1
            out.append(_DIGITS[value])
            length += 1
        out.append(")")
        values.append(value)
    op, words = getrandbits(_OPERATOR_BITS), words + 1
    while op >= len(OPERATORS):
        op, words = getrandbits(_OPERATOR_BITS), words + 1
    out[at] = OPERATORS[op]
    out += ("]", ")")
    return length, _apply(op, values), words


def sample_tree(rng: random.Random, max_depth: int = 10, max_args: int = 10) -> tuple[str, int, int]:
    """One tree drawn from ``rng`` as the official generator draws it: (Source, value, length)."""
    out: list = []
    length, value, _ = _tree(rng.random, rng.getrandbits, max_depth, max_args, out)
    return " ".join(out), value, length


# --- evaluating a Source string (used to check data, real or generated) ----------------------
def evaluate_source(source: str) -> int:
    """Value of a ListOps Source string in the release's format (parentheses are ignored)."""
    stack: list[tuple[str, list[int]]] = []
    result = None
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        if tok.startswith("["):
            stack.append((tok, []))
        elif tok == END:
            op, args = stack.pop()
            value = {MIN: min, MAX: max, FIRST: lambda a: a[0], LAST: lambda a: a[-1],
                     MED: median_int, SUM_MOD: lambda a: sum(a) % 10}[op](args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        else:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
    if stack or result is None:
        raise ValueError("unbalanced ListOps expression")
    return result


# --- the random stream, cut into segments ------------------------------------------------------
@dataclass
class Segment:
    """The candidate trees whose first word is in [start, stop), read from some word ``begin`` <=
    start: every candidate's start (sorted), the kept ones (accepted length) as (start, digest,
    Source, value), the first start at or after ``stop`` and the stream's state there."""

    starts: list[int] = field(default_factory=list)
    kept: list[tuple[int, bytes, str, int]] = field(default_factory=list)
    end: int = 0
    state: tuple = ()


def digest(source: str) -> bytes:
    """16-byte digest of a Source: de-duplication without keeping the trees."""
    return hashlib.blake2b(source.encode(), digest_size=16).digest()


def scan(state: tuple, begin: int, start: int, stop: int, params: dict) -> Segment:
    """Read candidate trees from word ``begin`` (``state``: the stream's state there) until one
    starts at or after ``stop``; record those that start at or after ``start``."""
    rng = random.Random()
    rng.setstate(state)
    random_, getrandbits = rng.random, rng.getrandbits
    max_depth, max_args = params["max_depth"], params["max_args"]
    min_length, max_length = params["min_length"], params["max_length"]
    seg, position = Segment(), begin
    while position < stop:
        out: list = []
        length, value, words = _tree(random_, getrandbits, max_depth, max_args, out)
        if position >= start:
            seg.starts.append(position)
            if min_length < length < max_length:
                source = " ".join(out)
                seg.kept.append((position, digest(source), source, value))
        position += words
    seg.end, seg.state = position, rng.getstate()
    return seg


def _skip(rng: random.Random, words: int) -> None:
    """Advance ``rng`` by ``words`` 32-bit words (``getrandbits(32 k)`` draws exactly k words)."""
    while words > 0:
        k = min(words, 1 << 20)
        rng.getrandbits(32 * k)
        words -= k


def _segments() -> Iterator[tuple[int, int]]:
    start, size = 0, FIRST_SEGMENT
    while True:
        yield start, start + size
        start, size = start + size, min(2 * size, MAX_SEGMENT)


def _worker_init() -> None:
    """Workers leave Ctrl-C to the main process and die with it (Linux: even after kill -9)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def default_workers() -> int:
    """The CPUs this process may use, at most 8 (beyond that the main process's reading of the
    stream, some 40 M words/s, is the limit)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, 8))


# Below this many words (expressions x their mean length bound), a set is generated in this process:
# starting the worker processes (a forkserver that imports this module, and with it torch through
# attnbench.tasks.lra, 2 s on the 2-core machine) costs more than they save. Measured there with the
# official lengths (500-2000): 200 expressions 0.2 s in this process, 2.2 s with 2 workers; 1,000
# expressions 1.6 s, 1.3 s with the workers' server already started.
WORDS_FOR_WORKERS = 2_000_000


def workers_for(total: int, params: dict) -> int:
    """The processes a set of ``total`` expressions is generated with by default: this process
    alone for a small set (``WORDS_FOR_WORKERS``), else :func:`default_workers`."""
    words = total * (params["min_length"] + params["max_length"]) // 2
    return 1 if words < WORDS_FOR_WORKERS else default_workers()


def candidates(seed: int, params: dict, workers: int = 1, stats: dict | None = None) -> Iterator[tuple[bytes, str, int]]:
    """(digest, Source, value) of every candidate of accepted length, in generation order,
    duplicates included, without end. ``workers`` > 1: segments are read by worker processes and
    stitched (module docstring); ``stats`` counts segments and those re-read from the true start."""
    stats = {} if stats is None else stats
    stats.update(segments=0, reread=0)
    true_start = 0  # the first start of the true chain at or after the segment's start
    if workers <= 1:
        state = random.Random(seed).getstate()
        for _, stop in _segments():
            seg = scan(state, true_start, true_start, stop, params)
            stats["segments"] += 1
            for _, d, source, value in seg.kept:
                yield d, source, value
            true_start, state = seg.end, seg.state
        return

    import multiprocessing

    # forkserver: workers forked from a clean single-threaded server that imports only this module.
    # A plain fork of the calling process (threads of torch, logging, a test runner's timer) can
    # leave a worker waiting forever on a lock another thread held at the fork; spawn would import
    # the CLI and torch again in every worker.
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
    else:
        ctx = multiprocessing.get_context()
    cursor, cursor_at = random.Random(seed), 0  # the main process reads the stream once
    segments, pending = _segments(), deque()
    with ctx.Pool(workers, initializer=_worker_init) as pool:  # leaving it terminates the workers
        def submit() -> None:
            nonlocal cursor_at
            start, stop = next(segments)
            begin = max(0, start - BURN_IN)
            _skip(cursor, begin - cursor_at)
            cursor_at = begin
            pending.append((stop, pool.apply_async(scan, (cursor.getstate(), begin, start, stop, params))))

        for _ in range(workers + 1):
            submit()
        while True:
            stop, result = pending.popleft()
            submit()
            seg = result.get()
            stats["segments"] += 1
            if true_start >= stop:  # one tree spans the whole segment
                continue
            i = bisect_left(seg.starts, true_start)
            if i == len(seg.starts) or seg.starts[i] != true_start:  # the chains have not met yet
                stats["reread"] += 1
                rng = random.Random(seed)
                _skip(rng, true_start)
                seg = scan(rng.getstate(), true_start, true_start, stop, params)
            for position, d, source, value in seg.kept:
                if position >= true_start:
                    yield d, source, value
            true_start = seg.end


def generate_rows(total: int, seed: int, params: dict, workers: int = 1,
                  stats: dict | None = None) -> Iterator[tuple[str, int]]:
    """The first ``total`` distinct (Source, value) in generation order."""
    if total <= 0:
        return
    seen: set[bytes] = set()
    stream = candidates(seed, params, workers, stats)
    try:
        for d, source, value in stream:
            if d not in seen:
                seen.add(d)
                yield source, value
                if len(seen) == total:  # before waiting for a segment that is not needed
                    return
    finally:
        stream.close()  # stops the workers


def _check(params: dict) -> None:
    if params["min_length"] + 1 >= params["max_length"]:
        raise ValueError(f"no tree length fits min_length={params['min_length']} < length < "
                         f"max_length={params['max_length']}")
    if params["max_args"] < 2 or params["max_depth"] < 1:
        raise ValueError("the ListOps generator needs max_args >= 2 and max_depth >= 1")


def generate(num_train: int = 96000, num_val: int = 2000, num_test: int = 2000, max_depth: int = 10,
             max_args: int = 10, min_length: int = 500, max_length: int = 2000, seed: int = 0,
             workers: int = 1) -> dict[str, list[tuple[str, int]]]:
    """{'train', 'val', 'test'}: lists of (Source, Target), in memory (small sets; files: write_dataset)."""
    params = dict(max_depth=max_depth, max_args=max_args, min_length=min_length, max_length=max_length)
    _check(params)
    rows = list(generate_rows(num_train + num_val + num_test, seed, params, workers))
    return {"train": rows[:num_train], "val": rows[num_train:num_train + num_val], "test": rows[num_train + num_val:]}


def write_dataset(directory: Path, task: str = "basic", progress: Callable[[int, int], None] | None = None,
                  workers: int | None = None, stats: dict | None = None, **params) -> Path:
    """Generate ``<task>_{train,val,test}.tsv`` (+ generator.json) into ``directory``, streaming
    the rows to ``.part`` files renamed when complete. ``progress(done, total)`` is called per row;
    ``workers``: processes (default: :func:`workers_for` the set); the files are the same for any."""
    options = {**DEFAULTS, **{k: v for k, v in params.items() if v is not None}, "task": task}
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown ListOps generator options: {', '.join(sorted(unknown))}")
    gen = {k: int(v) for k, v in options.items() if k != "task"}
    tree_params = {k: gen[k] for k in ("max_depth", "max_args", "min_length", "max_length")}
    _check(tree_params)
    sizes = {"train": gen["num_train"], "val": gen["num_val"], "test": gen["num_test"]}
    total = sum(sizes.values())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    parts = {split: directory / f"{task}_{split}.tsv.part" for split in sizes}
    rows = generate_rows(total, gen["seed"], tree_params, workers_for(total, tree_params) if workers is None else workers,
                         stats)
    done = 0
    try:
        for split, n in sizes.items():
            with open(parts[split], "w", newline="") as f:
                writer = csv.writer(f, delimiter="\t")
                writer.writerow(["Source", "Target"])
                for row in islice(rows, n):
                    writer.writerow(row)
                    done += 1
                    if progress is not None:
                        progress(done, total)
        for split, part in parts.items():
            os.replace(part, directory / f"{task}_{split}.tsv")
    finally:
        rows.close()
        for part in parts.values():
            part.unlink(missing_ok=True)
    meta = {"generator": "attnbench tasks/listops_generator.py (LRA lra_benchmarks/data/listops.py)", **options}
    write_atomically(directory / "generator.json", json.dumps(meta, indent=1) + "\n")
    return directory
