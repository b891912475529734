"""Errors a user can make. Each prints as one line and exits with status 2, no traceback."""
from __future__ import annotations

import difflib
import sys

EXIT_USAGE = 2


class UserError(Exception):
    """A mistake in the command line, the config or the data location."""

    exit_code = EXIT_USAGE


class DataNotFoundError(UserError):
    """A dataset is not available locally; the message says where to put it and how to fetch it."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message: what a one-line report of it shows."""
    return (str(error).strip().splitlines() or [""])[0]


# What to do about an OS error on a path the user gave (the path is named before it).
_PATH_ADVICE = {
    "EACCES": "no permission: choose another path, or make it writable",
    "EPERM": "not permitted: choose another path, or make it writable",
    "EROFS": "a read-only file system: choose a path on a writable one",
    "ENOTDIR": "a part of the path is a file, not a folder: choose another path",
    "EISDIR": "it is a folder: give a file name",
    "ENAMETOOLONG": "the name is too long: choose a shorter path",
    "ENOENT": "a folder of the path does not exist: create it or choose another path",
    "EEXIST": "a file is in the way: choose another path or remove it",
    "ENOSPC": "the disk is full: free space or choose another path",
    "EDQUOT": "the disk quota is exceeded: free space or choose another path",
}


def path_error(error: OSError) -> UserError | None:
    """One line for an OS error on a named path (unwritable, read-only, not a folder, too long,
    missing parent...): the path, the system's reason and what to do. None for other errors."""
    import errno

    name = errno.errorcode.get(error.errno or 0)
    if name not in _PATH_ADVICE or not error.filename:
        return None
    return UserError(f"{error.filename}: {error.strerror or name} ({_PATH_ADVICE[name]})")


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """``message`` on stderr, once per process (a sweep's jobs share one warning about one file)."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(message, file=sys.stderr, flush=True)


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_choice(kind: str, name: str, choices) -> UserError:
    choices = sorted(choices)
    return UserError(f"unknown {kind} '{name}'{did_you_mean(name, choices)}; valid: {', '.join(choices)}")


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite (the run's status is ``nan``)."""


class PrunedError(RuntimeError):
    """An Optuna trial stopped by its study's pruner at an evaluation (the run's status is ``pruned``:
    bench_cli/engine/pruning.py)."""


class Interrupted(KeyboardInterrupt):
    """A run stopped from outside: Ctrl-C (SIGINT), SIGTERM (what Slurm, torchrun and `timeout`
    send) or SIGQUIT (Ctrl-\\). Raised by the handler ``catch_termination`` installs, so those
    unwind like Ctrl-C: the run records an ``interrupted`` row, then the process exits 128 + the
    signal number."""

    def __init__(self, signum: int):
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def interruption_name(err: BaseException) -> str:
    """How an interruption is named in records and messages: 'SIGTERM', or 'Ctrl-C' for SIGINT."""
    return str(err) if isinstance(err, Interrupted) and err.signum != 2 else "Ctrl-C"


def exit_code_of(err: BaseException) -> int:
    return err.exit_code if isinstance(err, Interrupted) else 130


# What Slurm, torchrun, `timeout` and a closed terminal send: SIGTERM, SIGUSR1 (Slurm's warning
# before a time limit or a preemption with --signal=USR1), SIGUSR2 (submitit's: it requeues the
# job), SIGHUP.
TERMINATION_SIGNALS = ("SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGHUP")  # SIGQUIT: Ctrl-\ (a core dump, no row)
_deferring = [False]
_pending: list[int] = []
# One signal that arrives twice at once is one: a sweep hands the signal it receives to its jobs'
# processes (bench_cli/commands/sweep/stop.py), which may have had it already (`timeout` and a
# closed terminal signal the whole process group); only a later one means "stop at once".
SAME_SIGNAL_S = 1.0
_last_signal: list = [0, float("-inf")]  # [signum, time.monotonic()] of the last one received


def catch_termination() -> None:
    """Turn the termination signals into ``Interrupted`` in the main thread (a no-op elsewhere,
    where Python cannot install handlers). While ``signals_deferred`` holds (a training loop),
    the first one is only noted, for the loop to stop at its next step boundary after writing a
    checkpoint (``pending_signal``), then hand it on to the handler installed before
    (``hand_on``: submitit requeues the job there); a second one stops at once (the same signal
    again within ``SAME_SIGNAL_S`` is the same one)."""
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        now = time.monotonic()
        if _last_signal[0] == signum and now - _last_signal[1] < SAME_SIGNAL_S:
            return
        _last_signal[:] = [signum, now]
        if _deferring[0] and not _pending:
            _pending.append(signum)
            return
        raise Interrupted(signum)

    # The handler a launcher had installed (submitit's requeue) is kept on this handler, per signal,
    # not in the module: it is handed on only while this handler is the one installed. Kept in the
    # module, it outlived what installed it: a job run in a sweep's own process kept the sweep's
    # handler (bench_cli/commands/sweep/stop.py), and a later run in that process, signalled, called
    # it after the sweep had ended; it marked that sweep stopping, and every later sweep of the
    # process then started none of its jobs.
    handler.attnbench = True
    handler.hands_on_to = {}
    for name in TERMINATION_SIGNALS:
        if hasattr(signal, name):
            signum = getattr(signal, name)
            before = signal.signal(signum, handler)
            if getattr(before, "attnbench", False):  # ours already: hand on to what that one handed on to
                before = before.hands_on_to.get(signum)
            if callable(before):
                handler.hands_on_to[signum] = before


def hand_on(signum: int) -> None:
    """The signal to the Python handler that was installed before ``catch_termination`` installed
    the one now in place (a launcher's: submitit requeues the job and exits), if any; then
    ``Interrupted``."""
    import signal

    before = getattr(signal.getsignal(signum), "hands_on_to", {}).get(signum)
    if before is not None:
        try:
            before(signum, None)
        except SystemExit as e:  # it ends the process (submitit, after requeuing): the record names the signal
            e.signal_name = Interrupted(signum).args[0]
            raise
    raise Interrupted(signum)


class signals_deferred:
    """While it holds, a termination signal waits for ``pending_signal`` to be asked. When the
    outermost one ends with a signal still pending, it is raised then (dropped when an exception
    is already on its way)."""

    def __enter__(self):
        self.outer = _deferring[0]
        if not self.outer:  # a new sitting: a signal before it (an earlier run in this process) is not this one's
            _last_signal[:] = [0, float("-inf")]
        _deferring[0] = True
        return self

    def __exit__(self, exc_type, *exc):
        _deferring[0] = self.outer
        if not self.outer and _pending:
            signum = _pending.pop()
            if exc_type is None:
                raise Interrupted(signum)


class ctrl_c_held:
    """A write that Ctrl-C must not cut in the middle (a checkpoint: torch's zip writer, cut by a
    KeyboardInterrupt, fails on its way out with "unexpected pos" and the run was recorded as a
    RuntimeError): a SIGINT during it is raised as KeyboardInterrupt when it ends. Main thread
    only, and not where SIGINT is ignored (a background process keeps ignoring it)."""

    def __enter__(self):
        import signal
        import threading

        self.got, self.before = [], None
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.before = signal.signal(signal.SIGINT, lambda signum, frame: self.got.append(signum))
        return self

    def __exit__(self, exc_type, *exc):
        import signal

        if self.before is not None:
            signal.signal(signal.SIGINT, self.before)
        if self.got and exc_type is None:
            raise KeyboardInterrupt


def pending_signal() -> int | None:
    """The termination signal received while deferred (cleared), or None."""
    return _pending.pop() if _pending else None


def signal_pending() -> int:
    """The termination signal waiting (not cleared; 0: none): a cheap check at every step."""
    return _pending[-1] if _pending else 0


def is_oom(err: BaseException) -> bool:
    """True for out-of-memory errors of any device (CUDA, the CPU allocator, MemoryError). Here, in
    core, so that the results layer names an ending without importing the engine; torch is looked up,
    never imported: an error of torch's comes only once torch is loaded."""
    torch = sys.modules.get("torch")
    text = str(err).lower()
    return (isinstance(err, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError)))
            or "out of memory" in text or "can't allocate memory" in text)
