"""Checkpoints of a fit, and the exact resume of an interrupted job (DESIGN.md: no work is lost).

A job's checkpoints live in one folder keyed by its ``job_key`` (bench_cli.results.job_keys):
``<trainer.checkpoint.root or the records file's folder/checkpoints>/<job_key>/ckpt-<n>.pt``, so a
rerun of the same job with the same records file finds them from any working folder. A checkpoint
holds everything the rest of the fit depends on (bench_cli.engine.trainer ``_Loop.state``): weights,
optimiser, scheduler, gradient scaler, the selection (best evaluation, its weights, early-stopping
count), the evaluation history, the position in the schedule (epoch, batches of it, optimiser
steps), the training losses not yet read, every random state (Python, NumPy, torch CPU and CUDA,
the training loader's generator) and the objective's settings. It is written to a temporary file
and renamed (a crash mid-write leaves the previous one), and read with
``torch.load(weights_only=True)``: plain data and tensors only, so a file cannot run code
(random states are stored as tensors and lists for that reason).

Whatever else the folder holds never costs the job its own checkpoints: a file it cannot use (cut
short, of another job, not a checkpoint, a folder) is passed over with one line, the job's own
checkpoints are numbered above every file there (so the newest is always its own), and pruning and
the final clean-up remove only the job's own checkpoints (those it wrote or read as its own) and
the temporary files of writes that were killed midway (bench_cli.core.files.remove_stale_temporaries:
a file no live process writes). The rest stays where it was, for its owner.

Settings (``trainer.checkpoint``, ``trainer.resume``) change where and how often a fit is saved,
never its result: they are not part of the job key (job_keys.NON_SEMANTIC_KEYS).

A distributed run (``trainer.strategy=ddp``) writes the same one file, from rank 0: the weights,
optimiser and selection are the same on every process (DDP averages the gradients, evaluations sum
their statistics), but each process has its own random states (its dropout stream, its loader's
generator) and its own training losses not yet read; rank 0 gathers those (``rank_part``, a few
kilobytes a process) into ``ranks`` before writing. One file rather than one per process: it is
written and renamed at once, so a job killed while saving never finds the files of different
steps side by side, and no process can resume from a checkpoint another does not have. Every
process reads the file rank 0 chose (the folder must be on a filesystem they all see, as the
records file is) and takes its own part; a checkpoint of another number of processes is refused
(the random streams are per process).
"""
from __future__ import annotations

import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench_cli.core.errors import UserError, ctrl_c_held
from bench_cli.engine import distributed

FORMAT = 1
RESUME_CHOICES = {True: "true", False: "false", "true": "true", "false": "false", "must": "must"}


@dataclass(frozen=True)
class Settings:
    """``trainer.checkpoint`` and ``trainer.resume`` read once. ``every``: 0 = after every
    evaluation, N = every N epochs (epoch schedules) or N optimiser steps (step schedules)."""

    every: int
    keep: int
    keep_final: bool
    resume: str  # true | false | must


def settings(trainer_cfg) -> Settings | None:
    """The checkpoint settings of a trainer config; None when checkpoints are off."""
    c = trainer_cfg.get("checkpoint") or {}
    resume = trainer_cfg.get("resume", True)
    if resume not in RESUME_CHOICES:
        raise UserError(f"trainer.resume={resume}: expected true, false or must")
    if not c.get("enabled", True):
        if RESUME_CHOICES[resume] == "must":
            raise UserError("trainer.resume=must needs checkpoints: trainer.checkpoint.enabled=false turns them off")
        return None
    every = c.get("every", "eval")
    if every in ("eval", None, 0):
        every = 0
    elif not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise UserError(f"trainer.checkpoint.every={every}: expected 'eval' or a whole number of epochs / steps")
    keep = c.get("keep", 1)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise UserError(f"trainer.checkpoint.keep={keep}: expected a whole number >= 1")
    return Settings(int(every), int(keep), bool(c.get("keep_final", False)), RESUME_CHOICES[resume])


def root_of(cfg) -> Path:
    """Where every job's checkpoint folder is: ``trainer.checkpoint.root``, by default
    ``checkpoints/`` beside the records file, as an absolute path."""
    root = (cfg.trainer.get("checkpoint") or {}).get("root")
    base = Path(str(root)).expanduser() if root else Path(str(cfg.results.path)).expanduser().parent / "checkpoints"
    return base.absolute()


def folder_of(cfg, job_key: str) -> Path:
    """The job's checkpoint folder: ``<root_of(cfg)>/<job_key>``."""
    return root_of(cfg) / job_key


def check_root(cfg) -> None:
    """Before a run: checkpoints can be written under the root (probed by creating a file, since
    permission bits do not stop root, and an immutable folder or a read-only mount says nothing
    in them); refused in one line, so a run never trains to fail at its first save."""
    from bench_cli.core.files import unwritable_folder

    if settings(cfg.trainer) is None:
        return
    root = root_of(cfg)
    blocked = unwritable_folder(root)
    if blocked is not None:
        raise UserError(f"trainer.checkpoint.root: cannot write checkpoints in {blocked} (read-only, not a folder, "
                        f"or no space); choose another trainer.checkpoint.root=DIR, or trainer.checkpoint.enabled=false")


# --- random states, as tensors and lists (torch.load(weights_only=True) reads nothing else) ------
def rng_state() -> dict:
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, torch.tensor(mt, dtype=torch.int64), gauss],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt.tolist()), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read(path: Path) -> dict:
    """A checkpoint file's contents (weights_only: a pickle that would build any other object is
    refused, without running it). Raises CheckpointError naming the file and the reason."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated, corrupt, or a pickle of something else than data
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Weights only load failed" in str(e):
            found = re.search(r"Unsupported global: GLOBAL (\S+)|Unsupported operand (\S+)", str(e))
            what = f" ({next(g for g in found.groups() if g)})" if found else ""
            reason = f"it holds objects other than tensors and plain data{what}, refused unread (loading could run code)"
        raise CheckpointError(f"checkpoint {path} is unreadable: {reason[:200]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not an attnbench checkpoint of format {FORMAT}")
    missing = [k for k in PARTS if k not in state]
    if missing or not isinstance(state["meta"], dict) or not isinstance(state["position"], dict):
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing) or 'a well-formed meta and position'}")
    return state


# what every checkpoint holds (bench_cli.engine.trainer._Loop.state, and the job's identity)
PARTS = ("job_key", "meta", "sittings", "wall_time_s", "position", "model", "optimizer", "scheduler", "scaler",
         "selection", "objective", "result", "pending")


# What differs between the processes of a distributed run (a checkpoint's ``ranks``: one of these
# per process): their random states (``position``'s ``rng`` and ``epoch_start_generator``: each
# process its own dropout stream and loader generator) and the training losses each has not read
# yet (``pending``). The rest of the state is the same on every process.
def rank_part(state: dict) -> dict:
    """This process's part of a fit's ``state``, on the CPU (it travels to rank 0)."""
    position = state["position"]
    return on_cpu({"rng": position["rng"], "epoch_start_generator": position["epoch_start_generator"],
                   "pending": state["pending"]})


def with_rank_part(state: dict, part: dict) -> dict:
    """``state`` (rank 0's) with another process's ``rank_part`` in place of rank 0's."""
    position = {**state["position"], "rng": part["rng"], "epoch_start_generator": part["epoch_start_generator"]}
    return {**state, "position": position, "pending": part["pending"]}


def on_cpu(value):
    """``value`` with its tensors on the CPU (nested dicts, lists and tuples)."""
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(v) for v in value)
    return value


class CheckpointError(UserError):
    """A checkpoint that cannot be used (one line naming the file)."""


def write_atomically(path: Path, state: dict) -> None:
    """``torch.save`` to a temporary file beside ``path``, synced, renamed over it."""
    from bench_cli.core.files import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        torch.save(state, f)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("ckpt-*.pt") if p.is_file()) if folder.is_dir() else 0


def job_checkpoint(path: Path, job_key: str) -> dict:
    """``path`` read as a checkpoint of job ``job_key``; CheckpointError (one line) otherwise."""
    state = read(path)
    if state.get("job_key") != job_key:
        raise CheckpointError(f"checkpoint {path} is of job {state.get('job_key')}, not {job_key}")
    return state


def resumable_from(cfg, job_key: str) -> Path | None:
    """The checkpoint the same command would resume job ``job_key`` of ``cfg`` from, or None:
    what a message may promise."""
    found = resumable_checkpoint(cfg, job_key)
    return found[0] if found is not None else None


def resumable_checkpoint(cfg, job_key: str) -> tuple[Path, dict] | None:
    """That checkpoint and its state, read once (None: the run starts from the beginning)."""
    s = settings(cfg.trainer)
    return None if s is None or s.resume == "false" else _newest_own(folder_of(cfg, job_key), job_key)


def resumable_from_folder(folder: Path, job_key: str) -> Path | None:
    """The newest file of ``folder`` that reads as one of job ``job_key``'s checkpoints, or None."""
    found = _newest_own(folder, job_key)
    return found[0] if found is not None else None


def _newest_own(folder: Path, job_key: str) -> tuple[Path, dict] | None:
    """That file and its state, read once."""
    for path in sorted(folder.glob("ckpt-*.pt"), key=_number, reverse=True) if folder.is_dir() else ():
        try:
            return path, job_checkpoint(path, job_key)
        except CheckpointError:
            continue
    return None


TEMPORARY = "ckpt-*.pt*.tmp"  # a checkpoint being written (bench_cli.core.files.atomic_open's name for it)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Checkpoints:
    """The checkpoints of one job: where they are, which to resume from, writing and pruning them,
    and what the record says about them (``columns``)."""

    def __init__(self, folder: Path, settings: Settings, job_key: str, meta: dict, started: float,
                 dist: distributed.DistEnv = distributed.SINGLE):
        self.folder, self.settings, self.job_key, self.meta = folder, settings, job_key, meta
        self.started = started  # perf_counter at the start of this sitting
        self.dist = dist  # this process's place in a distributed run: rank 0 writes, every process reads
        self.resumed_from, self.sittings, self.earlier_wall_s = "", 1, 0.0
        self.resumed_position: dict = {}  # the checkpoint's epoch and optimiser step this sitting started at
        self.sequence = 0  # number of the last checkpoint written, or the highest of the folder's files
        self.verdicts: dict[Path, bool] = {}  # file -> whether it is one of this job's checkpoints (read once)

    @classmethod
    def of(cls, cfg, job_key: str, meta: dict, started: float,
           dist: distributed.DistEnv = distributed.SINGLE) -> Checkpoints | None:
        """The job's checkpoints, or None when off."""
        s = settings(cfg.trainer)
        if s is None:
            return None
        checkpoints = cls(folder_of(cfg, job_key), s, job_key, meta, started, dist)
        if s.resume == "must" and not checkpoints.files():  # refused before the run starts: no record
            raise UserError(f"trainer.resume=must: no checkpoint of job {job_key} in {checkpoints.folder}")
        return checkpoints

    def files(self) -> list[Path]:
        """The folder's checkpoint files (``ckpt-<n>.pt``, whatever they hold), lowest number first."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob("ckpt-*.pt"), key=lambda p: _number(p))

    def own_files(self) -> list[Path]:
        """The job's own checkpoints, oldest first: those this sitting wrote or resumed from, and
        any other file that reads as one of this job's (read once per sitting)."""
        own = []
        for path in self.files():
            if path not in self.verdicts:
                try:
                    job_checkpoint(path, self.job_key)
                    self.verdicts[path] = True
                except CheckpointError:
                    self.verdicts[path] = False
            if self.verdicts[path]:
                own.append(path)
        return own

    def tidy(self) -> None:
        """Before the sitting's first write: number above every file of the folder (its own
        checkpoints then sort after anything it cannot use), and remove the temporary files of
        writes killed midway."""
        from bench_cli.core.files import remove_stale_temporaries

        self.sequence = max([self.sequence, *(_number(p) for p in self.files())])
        for path in remove_stale_temporaries(self.folder, TEMPORARY):
            say(f"removed {path}: a checkpoint write that was killed midway")

    def load(self) -> dict | None:
        """The newest usable checkpoint (None: start from the beginning), as this process resumes
        from it. In a distributed run rank 0 chooses it, every process reads it and takes its own
        part (``rank_part``); a problem on any process stops every one of them with its line (one that
        stopped alone would leave the others waiting in their next collective)."""
        if self.settings.resume == "false":
            if self.dist.is_main:
                self.tidy()
            return None
        state, error = None, None
        if self.dist.is_main:
            try:
                self.tidy()
                state = self.choose()
            except UserError as e:
                error = e
        path = distributed.broadcast(self.resumed_from if state is not None else "")
        if path and state is None and error is None:
            try:
                state = read(Path(path))
            except CheckpointError as e:
                error = CheckpointError(f"{e} on rank {self.dist.rank} (the checkpoint folder must be on a "
                                        "filesystem every process sees)")
        problems = [p for p in distributed.every_process(str(error) if error is not None else "") if p]
        if problems:
            raise error if error is not None else CheckpointError(problems[0])
        if not path:
            return None
        self.adopt(Path(path), state)
        return self.own_part(state, path)

    def own_part(self, state: dict, path) -> dict:
        """``state`` with this process's random states and pending losses (``ranks``); refused
        when it was written by another number of processes."""
        parts = state.get("ranks") or [None]
        if len(parts) != self.dist.world_size:
            written = f"{len(parts)} process{'es' if len(parts) > 1 else ''}"
            raise CheckpointError(f"checkpoint {path} was written by {written}, this run has {self.dist.world_size} "
                                  f"(every process keeps its own random states): run it with {len(parts)}, or "
                                  "with trainer.resume=false to start over")
        return state if self.dist.rank == 0 else with_rank_part(state, parts[self.dist.rank])

    def choose(self) -> dict | None:
        """The newest usable checkpoint, read. An unreadable one is one line naming it and what
        happens next: the previous one, starting over, or with ``trainer.resume=must`` a refusal."""
        files = self.files()
        for path in reversed(files):
            try:
                state = job_checkpoint(path, self.job_key)
            except CheckpointError as e:
                self.verdicts[path] = False
                older = files.index(path) > 0
                if self.settings.resume == "must" and not older:
                    raise UserError(f"{e}; trainer.resume=must: refusing to start over (remove it, or use trainer.resume=true)") from None
                say(f"{e}: {'trying the previous one' if older else 'starting over from the beginning'} "
                    "(the file is left as it is; this job's checkpoints are numbered above it)")
                continue
            self.adopt(path, state)
            written = state.get("meta", {}).get("git_commit")
            differs = f" (written by commit {written}, this is {self.meta.get('git_commit')})" if written != self.meta.get("git_commit") else ""
            say(f"resuming from {path}: {position_text(state['position'])}, sitting {self.sittings}{differs}")
            return state
        if self.settings.resume == "must":
            raise UserError(f"trainer.resume=must: no checkpoint of job {self.job_key} in {self.folder}")
        return None

    def adopt(self, path: Path, state: dict) -> None:
        """Continue the job from ``path`` (``state``, read): its number, sittings and wall time."""
        self.resumed_from = str(path)
        self.resumed_position = {k: state["position"].get(k) for k in ("epoch", "step")}
        self.sittings = int(state.get("sittings", 1)) + 1
        self.earlier_wall_s = float(state.get("wall_time_s", 0.0))
        self.sequence = max(self.sequence, _number(path))
        self.verdicts[path] = True

    def save(self, state: dict) -> Path | None:
        """Write ``state`` as the next checkpoint (with the job's identity and the sittings' wall
        time), then remove the oldest beyond ``keep``. In a distributed run every process calls it
        with its own ``state``; rank 0 writes it with every process's ``rank_part`` (None elsewhere)."""
        if self.dist.world_size > 1:
            parts = distributed.gather_to_main(rank_part(state))
            if not self.dist.is_main:
                return None
            state = {**state, "ranks": parts}
        self.sequence += 1
        path = self.folder / f"ckpt-{self.sequence:06d}.pt"
        wall = self.earlier_wall_s + time.perf_counter() - self.started
        with ctrl_c_held():  # Ctrl-C waits for the file and the pruning: the run is then recorded as interrupted
            write_atomically(path, {"format": FORMAT, "job_key": self.job_key, "meta": self.meta,
                                    "sittings": self.sittings, "wall_time_s": wall, **state})
            self.verdicts[path] = True
            for old in self.own_files()[:-self.settings.keep]:  # the job's own only: never a file it cannot use
                old.unlink(missing_ok=True)
        return path

    def finish(self, status: str) -> None:
        """After the record: an ``ok`` job's checkpoints are removed unless ``keep_final`` (its
        own only; the folder too when nothing else is left in it)."""
        if status not in ("ok", "pruned") or self.settings.keep_final or not self.folder.is_dir():
            return
        from bench_cli.core.files import remove_stale_temporaries

        for path in self.own_files():
            path.unlink(missing_ok=True)
        remove_stale_temporaries(self.folder, TEMPORARY)
        left = sorted(p.name for p in self.folder.iterdir())
        if left:
            say(f"left in {self.folder}: {', '.join(left[:3])}{' ...' if len(left) > 3 else ''} "
                f"(not checkpoints of this job; remove them when they are of no use)")
            return
        for folder in (self.folder, self.folder.parent):  # the checkpoints folder too, when this was its last job
            try:
                folder.rmdir()
            except OSError:
                break

    def columns(self) -> dict:
        """The record's resume columns (bench_cli.results.schema)."""
        own = sum(p.stat().st_size for p in self.own_files() if p.is_file())
        return {"resumed_from": self.resumed_from, "resumed_epoch": self.resumed_position.get("epoch"),
                "resumed_step": self.resumed_position.get("step"), "sittings": self.sittings,
                "checkpoint_dir": str(self.folder), "checkpoint_bytes": own}


def resume_point(cfg, job_key: str) -> str:
    """Where the job's next run continues: 'epoch 3, step 15' of the checkpoint the same command
    would resume from (``resumable_from``: the newest readable one of this job), '' when it starts
    from the beginning (no checkpoint, checkpoints off, trainer.resume=false)."""
    found = resumable_checkpoint(cfg, job_key)
    return position_text(found[1]["position"]) if found is not None else ""


def position_text(position: dict) -> str:
    """'epoch 3, step 15': a checkpoint's place in the fit, as the resume line and the sweep say it."""
    return f"epoch {position.get('epoch')}, step {position.get('step')}"


def _number(path: Path) -> int:
    try:
        return int(path.stem.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1
