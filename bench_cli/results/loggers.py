"""Experiment trackers. The CSV record is written whatever the logger; `logger=wandb` adds
Weights & Biases (config, per-epoch curves, final metrics, tables)."""
from __future__ import annotations

import os
from pathlib import Path

from bench_cli.core.errors import unknown_choice


class NullLogger:
    def log_epoch(self, row: dict) -> None: ...
    def log_summary(self, row: dict) -> None: ...
    def log_table(self, name: str, rows: list[dict]) -> None: ...
    def log_image(self, name: str, path: str | Path) -> None: ...
    def finish(self, status: str = "ok") -> None: ...


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


class WandbLogger(NullLogger):
    def __init__(self, cfg, config: dict, run_dir: Path, name: str, job_type: str = "run"):
        from bench_cli.core.net import reachable
        from bench_cli.core.ui import console

        mode = wandb_mode(cfg.get("mode", "auto"))
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        if mode == "online" and not reachable(host):  # no network: offline at once, not after minutes of retries
            mode = "offline"
            console.print(f"wandb: {host} is not reachable; logging offline in {run_dir}/wandb "
                          f"(upload later with `wandb sync`)", highlight=False, soft_wrap=True)
        if not console.is_terminal:  # wandb's own coloured lines would put raw escape codes in the log
            os.environ.setdefault("WANDB_SILENT", "true")
        from bench_cli.core.extras import require

        self.wandb = wandb = require("wandb", "wandb", "logger=wandb")
        self.run = wandb.init(
            project=cfg.get("project", "attnbench"), entity=cfg.get("entity"), group=cfg.get("group"),
            tags=list(cfg.get("tags") or []), name=name, config=config, dir=str(run_dir),
            mode=mode, job_type=job_type, reinit="finish_previous",
        )

    def log_epoch(self, row: dict) -> None:
        self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=int(row["epoch"]))

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
        best = f" (best {row['best_' + name]:.4g} @ epoch {row['best_epoch']})" if "best_epoch" in row else ""
        line = (f"{self.prefix}epoch {row['epoch']} step {row['step']} | train loss {row.get('train_loss', float('nan')):.4g}"
                f" | {self.split} {self.metric.name} {shown}{best} | {time.perf_counter() - self.started:.0f} s")
        self.log.info(line)
        if self.echo:
            console.print(line, highlight=False, soft_wrap=True, markup=False)


class Loggers(NullLogger):
    """Several loggers as one."""

    def __init__(self, *loggers):
        self.loggers = [lg for lg in loggers if lg is not None]

    def log_epoch(self, row: dict) -> None:
        for lg in self.loggers:
            lg.log_epoch(row)

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


def make_logger(cfg, config: dict, run_dir: Path, name: str, job_type: str = "run"):
    kind = cfg.get("name", "none")
    if kind == "none":
        return NullLogger()
    if kind == "wandb":
        return WandbLogger(cfg, config, run_dir, name, job_type)
    raise unknown_choice("logger", kind, ["none", "wandb"])
