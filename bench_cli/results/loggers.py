"""Experiment trackers and a run's history. Every run writes ``history.csv`` in its folder (one
row per evaluation, and the training loss every ``logger.log_every_n_steps`` optimiser steps),
whatever the logger; ``logger=wandb`` adds Weights & Biases and ``logger=tensorboard`` TensorBoard
scalars, of the same rows. The CSV record is written in any case (bench_cli.results.run_folder)."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from bench_cli.core.errors import unknown_choice
from bench_cli.core.files import write_atomically

LOGGERS = ("none", "wandb", "tensorboard")
STEP_LOSS = "train_loss_step"  # the training loss of the last log_every_n_steps steps (Lightning's name)


class NullLogger:
    # live: it shows points while the run goes on, so the step losses are read when they are made
    # (one host-device sync every log_every_n_steps steps: StepLosses)
    live = False

    def log_step(self, point: dict) -> None:
        """``{"epoch", "step", STEP_LOSS}`` every ``log_every_n_steps`` optimiser steps."""

    def log_epoch(self, row: dict) -> None:
        """One evaluation: the trainer's history row, with the selection so far (``best_*``)."""

    def log_restored(self, history: list[dict], points: list[dict]) -> None:
        """What a resumed fit's checkpoint holds (evaluation rows, step points), logged before
        anything new: replayed in step order."""
        for kind, row in in_step_order(history, points):
            (self.log_step if kind == "step" else self.log_epoch)(row)

    def log_summary(self, row: dict) -> None: ...
    def log_table(self, name: str, rows: list[dict]) -> None: ...
    def log_image(self, name: str, path: str | Path) -> None: ...
    def finish(self, status: str = "ok") -> None: ...

    def locations(self) -> list[tuple[str, str]]:
        """(label, path or command) of what it wrote, for the run's summary."""
        return []


def in_step_order(history: list[dict], points: list[dict]) -> list[tuple[str, dict]]:
    """Step points and evaluation rows as ("step" | "eval", row), by step; at the same step the
    point first (an evaluation row also carries the selection so far)."""
    tagged = [(p["step"], 0, "step", p) for p in points] + [(r["step"], 1, "eval", r) for r in history]
    return [(kind, row) for _, _, kind, row in sorted(tagged, key=lambda t: t[:2])]


class StepLosses:
    """The training loss every ``every`` optimiser steps: the mean of the batch losses since the
    previous point, added up on the device (no host-device sync in the step loop). With a live
    logger (wandb, tensorboard) a point is read when it is made: one sync every ``every`` steps,
    as Lightning's ``log_every_n_steps``; otherwise the points wait on the device and are read at
    the next evaluation, where the trainer reads its losses anyway (no sync of their own).
    ``logger`` None (another process of a distributed run): nothing is kept."""

    def __init__(self, logger):
        self.logger = logger
        self.every = int(getattr(logger, "every_n_steps", 0) or 0) if logger is not None else 0
        self.live = bool(logger is not None and logger.live)
        self.total, self.batches = None, 0  # the losses since the last point (a device scalar) and their count
        self.waiting: list[tuple[int, int, object]] = []  # (step, epoch, mean on the device) not read yet
        self.points: list[dict] = []  # every point read, in order (a resumed fit continues them)

    def add(self, loss) -> None:
        """One (micro-)batch's loss, detached."""
        if self.every:
            self.total = loss.float() if self.total is None else self.total + loss.float()
            self.batches += 1

    def stepped(self, step: int, epoch: int) -> None:
        """After optimiser step ``step`` of ``epoch``: a point when ``step`` is a multiple of ``every``."""
        if self.every and step % self.every == 0 and self.batches:
            self.waiting.append((step, epoch, self.total / self.batches))
            self.total, self.batches = None, 0
            if self.live:
                self.read()

    def read(self) -> None:
        """The waiting points, read from the device at once and logged."""
        if not self.waiting:
            return
        import torch

        values = torch.stack([mean for *_, mean in self.waiting]).tolist()
        for (step, epoch, _), value in zip(self.waiting, values):
            point = {"epoch": epoch, "step": step, STEP_LOSS: value}
            self.points.append(point)
            self.logger.log_step(point)
        self.waiting = []

    def state_dict(self) -> dict:
        """For a checkpoint: tensors, numbers and lists only (torch.load(weights_only=True))."""
        return {"total": self.total, "batches": self.batches, "points": list(self.points),
                "waiting": [[step, epoch, mean] for step, epoch, mean in self.waiting]}

    def load_state_dict(self, state: dict | None, device, history: list[dict]) -> None:
        """A checkpoint's state (None: one written before step losses were kept), then the
        restored history and points handed to the logger (``log_restored``)."""
        if self.logger is None:
            return
        if state and self.every:
            self.total = None if state["total"] is None else state["total"].to(device)
            self.batches, self.points = int(state["batches"]), list(state["points"])
            self.waiting = [(int(step), int(epoch), mean.to(device)) for step, epoch, mean in state["waiting"]]
        self.logger.log_restored(list(history), list(self.points))


def wandb_mode(requested: str = "auto") -> str:
    """online when an API key is configured, offline otherwise; WANDB_MODE always wins."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if requested != "auto":
        return requested
    has_key = bool(os.environ.get("WANDB_API_KEY")) or "api.wandb.ai" in _netrc()
    return "online" if has_key else "offline"


def _netrc() -> str:
    p = Path.home() / ".netrc"
    return p.read_text(errors="ignore") if p.is_file() else ""


def sweep_job() -> tuple[str, int] | None:
    """(the sweep's folder name, the job's number) when this process runs a job of a sweep
    (Hydra's multirun: `attnbench sweep`, any launcher); None for `attnbench run`."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:
        return None
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    return Path(str(hc.sweep.dir)).name, int(hc.job.num)


def run_group(experiment: str, sweep: tuple[str, int] | None) -> str | None:
    """A wandb group: the experiment, and the sweep the job belongs to (its folder's name, which
    is the sweep's id): "primal_dual/table1/sweep-20261126T211401-ab12cd"; None for a lone run
    outside an experiment."""
    parts = [experiment] if experiment else []
    if sweep is not None:
        parts.append(f"sweep-{sweep[0]}")
    return "/".join(parts) or None


# wandb's own files in a run's files/ (config.yaml among them: its format, written by wandb when
# online): the run's resolved config goes beside them, in a folder of its own
CONFIG_IN_WANDB = Path("attnbench") / "config.yaml"
RESUME_FILE = "wandb-run.json"  # in the job's checkpoint folder: the wandb run a resumed fit continues


class WandbLogger(NullLogger):
    """``job``: the run's identity columns (task, dataset, model, seed, experiment) when it logs a
    training run: the group, tags and name come from them; ``resume_folder``: the job's checkpoint
    folder, where the wandb run's id is kept so that a resumed fit continues the same wandb run."""

    live = True

    def __init__(self, cfg, config: dict, run_dir: Path, name: str, job_type: str = "run", job: dict | None = None,
                 resume_folder: Path | None = None):
        from bench_cli.core.net import reachable
        from bench_cli.core.ui import console

        self.mode = mode = wandb_mode(cfg.get("mode", "auto"))
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        if mode == "online" and not reachable(host):  # no network: offline at once, not after minutes of retries
            self.mode = mode = "offline"
            console.print(f"wandb: {host} is not reachable; logging offline in {run_dir}/wandb "
                          f"(upload later with `wandb sync`)", highlight=False, soft_wrap=True)
        if not console.is_terminal:  # wandb's own coloured lines would put raw escape codes in the log
            os.environ.setdefault("WANDB_SILENT", "true")
        from bench_cli.core.extras import require

        self.wandb = wandb = require("wandb", "wandb", "logger=wandb")
        tags, group = list(cfg.get("tags") or []), cfg.get("group")
        if job is not None:
            sweep = sweep_job()
            tags += [str(job[k]) for k in ("task", "dataset", "model")]
            group = group or run_group(str(job.get("experiment") or ""), sweep)
            if sweep is not None:
                name = f"{name}-job{sweep[1]}"
        self.resume_file = Path(resume_folder) / RESUME_FILE if resume_folder is not None else None
        earlier = self._earlier()
        run_id = earlier["id"] if earlier else uuid.uuid4().hex[:8]
        self.run = wandb.init(
            project=cfg.get("project", "attnbench"), entity=cfg.get("entity"), group=group,
            tags=list(dict.fromkeys(t[:64] for t in tags)), name=name, config=config, dir=str(run_dir),
            mode=mode, job_type=job_type, reinit="finish_previous", id=run_id,
            resume="allow" if earlier else None,
        )
        self.resumed = earlier is not None
        self.earlier_dirs = list(earlier["dirs"]) if earlier else []  # offline folders of the earlier sittings
        self.url = self.run.url if mode == "online" else None
        self.first_step = self.run.step  # a resumed online run holds the steps before it already
        if self.resume_file is not None:
            self.resume_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.resume_file, json.dumps({"id": run_id, "dirs": self.earlier_dirs + [self.run_path]}))
        self._save_config(config, run_dir)

    def _earlier(self) -> dict | None:
        """The wandb run of the job's earlier sitting, when its fit will resume from a checkpoint."""
        f = self.resume_file
        if f is None or not f.is_file() or not any(f.parent.glob("ckpt-*.pt")):
            return None
        try:
            earlier = json.loads(f.read_text())
        except (OSError, ValueError):
            return None
        return earlier if isinstance(earlier, dict) and isinstance(earlier.get("id"), str) else None

    def _save_config(self, config: dict, run_dir: Path) -> None:
        """The resolved config as a file of the wandb run (its ``files/``; uploaded with it): the
        run folder's config.yaml when there is one, else ``config`` as YAML. A copy, not a link:
        the offline folder stays whole when it is moved to a machine with network to sync it."""
        import yaml

        source = Path(run_dir) / "config.yaml"
        text = source.read_text(encoding="utf-8") if source.is_file() else yaml.safe_dump(config, sort_keys=False)
        target = Path(self.run.dir) / CONFIG_IN_WANDB
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, text)
        self.run.save(str(target), base_path=self.run.dir, policy="now")

    def log_step(self, point: dict) -> None:
        if point["step"] >= self.first_step:
            self.run.log({STEP_LOSS: point[STEP_LOSS], "epoch": point["epoch"]}, step=int(point["step"]))

    def log_epoch(self, row: dict) -> None:
        # x-axis: optimiser steps, as the step losses (wandb's step only grows); the epoch is a metric
        if row["step"] >= self.first_step:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"},
                         step=int(row["step"]))

    def log_restored(self, history: list[dict], points: list[dict]) -> None:
        if not self.resumed:  # a new wandb run: it gets the fit's history so far
            super().log_restored(history, points)

    def log_summary(self, row: dict) -> None:
        for k, v in row.items():
            if isinstance(v, (int, float, str, bool)) and v != "":
                self.run.summary[k] = v

    def log_table(self, name: str, rows: list[dict]) -> None:
        if rows:
            cols = list(rows[0])
            self.run.log({name: self.wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})

    def log_image(self, name: str, path) -> None:
        self.run.log({name: self.wandb.Image(str(path))})

    def finish(self, status: str = "ok") -> None:
        self.run.finish(exit_code=0 if status == "ok" else 1)
        # Stop wandb's service and its threads (an asyncio loop, a finaliser): they outlive the run
        # otherwise, in a process that goes on working (a sweep's next job, a test session), where
        # garbage collection may run any object's finaliser (h5py, torch...) on them. The next
        # wandb.init starts the service again.
        self.wandb.teardown()

    @property
    def run_path(self) -> str:
        return str(Path(self.run.dir).parent)

    def locations(self) -> list[tuple[str, str]]:
        if self.url:
            return [("wandb run", self.url)]
        folders = " ".join(dict.fromkeys([*self.earlier_dirs, self.run_path]))  # a resumed run: every sitting, in order
        return [(f"wandb {self.mode} run", self.run_path), ("upload it with", f"wandb sync {folders}")]


def offline_sync(output_dirs: list[str]) -> tuple[int, str] | None:
    """(how many, the `wandb sync` command) of the offline wandb runs in these run folders (a
    sweep's jobs'): one glob per folder that holds the run folders; None when there are none."""
    holding: dict[str, int] = {}
    for d in dict.fromkeys(output_dirs):
        n = len(list(Path(d).glob("wandb/offline-run-*")))
        if n:
            holding[str(Path(d).parent)] = holding.get(str(Path(d).parent), 0) + n
    if not holding:
        return None
    return sum(holding.values()), "wandb sync " + " ".join(f"{p}/*/wandb/offline-run-*" for p in sorted(holding))


class TensorBoardLogger(NullLogger):
    """TensorBoard scalars of the history's columns (x-axis: optimiser steps) in the run folder's
    ``tensorboard/``. Its events file is TensorBoard's own log, appended record by record (each
    with its length and checksum: a reader skips a torn last record)."""

    live = True

    def __init__(self, run_dir: Path):
        from bench_cli.core.extras import require

        require("tensorboard", "tensorboard", "logger=tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log_step(self, point: dict) -> None:
        self.writer.add_scalar(STEP_LOSS, point[STEP_LOSS], int(point["step"]))

    def log_epoch(self, row: dict) -> None:
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                self.writer.add_scalar(k, v, int(row["step"]))
        self.writer.flush()  # an evaluation is seen at once, not after the writer's 2 minutes

    def log_table(self, name: str, rows: list[dict]) -> None:
        if rows:
            from bench_cli.results.report.render import markdown_table

            cols = list(rows[0])  # TensorBoard renders text as Markdown: cells escaped as a report's
            self.writer.add_text(name, "\n".join(markdown_table([[str(r.get(c, "")) for c in cols] for r in rows], cols)))

    def log_image(self, name: str, path) -> None:
        import matplotlib.image

        self.writer.add_image(name, matplotlib.image.imread(str(path))[..., :3], dataformats="HWC")

    def finish(self, status: str = "ok") -> None:
        self.writer.close()

    def locations(self) -> list[tuple[str, str]]:
        return [("tensorboard", f"tensorboard --logdir {self.dir}")]


class HistoryCSV(NullLogger):
    """``history.csv`` in the run folder: a row per step at which something was logged (the step
    loss, an evaluation, or both), columns step, epoch, train_loss_step, then the evaluation's
    (train_loss: the mean since the previous evaluation, lr, the split's metrics). Rewritten
    whole and atomically at each evaluation and at the end: its header grows when the first
    evaluation brings its columns, and a reader never sees half a file. A resumed fit starts
    from the checkpoint's rows (``log_restored``): none lost, none twice."""

    FIRST = ("step", "epoch", STEP_LOSS)

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "history.csv"
        self.rows: dict[int, dict] = {}

    def _merge(self, row: dict) -> None:
        self.rows.setdefault(int(row["step"]), {}).update({k: v for k, v in row.items() if not k.startswith("best_")})

    def log_step(self, point: dict) -> None:
        self._merge(point)

    def log_epoch(self, row: dict) -> None:
        self._merge(row)
        self.write()

    def log_restored(self, history: list[dict], points: list[dict]) -> None:
        for _, row in in_step_order(history, points):
            self._merge(row)
        self.write()

    def finish(self, status: str = "ok") -> None:
        self.write()

    def write(self) -> None:
        import csv
        import io

        rows = [self.rows[step] for step in sorted(self.rows)]
        columns = list(self.FIRST) + [k for k in dict.fromkeys(k for r in rows for k in r) if k not in self.FIRST]
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_atomically(self.path, out.getvalue())

    def locations(self) -> list[tuple[str, str]]:
        return [("history", str(self.path))]


class LineLogger(NullLogger):
    """One line per evaluation -- epoch/step, training loss, the selection metric and its best so
    far, elapsed time -- into the run's log file (``logging``), and onto the console when the
    console is not a terminal (nohup, Slurm, a pipe): there the live progress bar is absent."""

    def __init__(self, metric, split: str, prefix: str = "", echo: bool | None = None):
        import logging
        import time

        from bench_cli.core.ui import console

        self.metric, self.split, self.prefix = metric, split, prefix
        self.echo = (not console.is_terminal) if echo is None else echo
        self.log, self.started = logging.getLogger("attnbench.train"), time.perf_counter()

    def log_epoch(self, row: dict) -> None:
        import time

        from bench_cli.core.ui import console

        name = f"{self.split}_{self.metric.name}"
        value = row.get(name)
        shown = "-" if value is None else f"{value:.4g}"
        # the trainer's selection (bench_cli.engine.trainer.Selection: ties to the lower loss), as the record says
        best = f" (best {row['best_' + name]:.4g} @ {row['best_at']})" if "best_at" in row else ""
        line = (f"{self.prefix}epoch {row['epoch']} step {row['step']} | train loss {row.get('train_loss', float('nan')):.4g}"
                f" | {self.split} {self.metric.name} {shown}{best} | {time.perf_counter() - self.started:.0f} s")
        self.log.info(line)
        if self.echo:
            console.print(line, highlight=False, soft_wrap=True, markup=False)

    def log_restored(self, history: list[dict], points: list[dict]) -> None:
        """Nothing: the earlier sitting printed its lines (checkpoint.py says where it resumes)."""


class Loggers(NullLogger):
    """Several loggers as one; ``every_n_steps``: how often the training loss is logged."""

    def __init__(self, *loggers, every_n_steps: int = 0):
        self.loggers = [lg for lg in loggers if lg is not None]
        self.every_n_steps = every_n_steps
        self.live = any(lg.live for lg in self.loggers)

    def log_step(self, point: dict) -> None:
        for lg in self.loggers:
            lg.log_step(point)

    def log_epoch(self, row: dict) -> None:
        for lg in self.loggers:
            lg.log_epoch(row)

    def log_restored(self, history: list[dict], points: list[dict]) -> None:
        for lg in self.loggers:
            lg.log_restored(history, points)

    def log_summary(self, row: dict) -> None:
        for lg in self.loggers:
            lg.log_summary(row)

    def log_table(self, name: str, rows: list[dict]) -> None:
        for lg in self.loggers:
            lg.log_table(name, rows)

    def log_image(self, name: str, path) -> None:
        for lg in self.loggers:
            lg.log_image(name, path)

    def finish(self, status: str = "ok") -> None:
        for lg in self.loggers:
            lg.finish(status)

    def locations(self) -> list[tuple[str, str]]:
        return [where for lg in self.loggers for where in lg.locations()]


def make_logger(cfg, config: dict, run_dir: Path, name: str, job_type: str = "run", job: dict | None = None,
                resume_folder: Path | None = None):
    """The tracker of ``logger=`` (``cfg``: the logger config); ``job`` and ``resume_folder``: see
    WandbLogger."""
    kind = cfg.get("name", "none")
    if kind == "none":
        return NullLogger()
    if kind == "wandb":
        return WandbLogger(cfg, config, run_dir, name, job_type, job=job, resume_folder=resume_folder)
    if kind == "tensorboard":
        return TensorBoardLogger(run_dir)
    raise unknown_choice("logger", kind, list(LOGGERS))


def run_loggers(cfg, config: dict, run_dir: Path, row: dict, lines: LineLogger,
                resume_folder: Path | None = None) -> Loggers:
    """A training run's loggers: the tracker of ``logger=`` (``cfg``), the evaluation lines, the
    history CSV; the training loss every ``logger.log_every_n_steps`` steps (Lightning's 50 by
    default; 0: none). ``row``: the run's identity columns."""
    tracker = make_logger(cfg, config, run_dir, name=f"{row['task']}-{row['dataset']}-{row['model']}-s{row['seed']}",
                          job=row, resume_folder=resume_folder)
    return Loggers(tracker, lines, HistoryCSV(run_dir), every_n_steps=int(cfg.get("log_every_n_steps", 50) or 0))
