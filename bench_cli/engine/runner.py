"""One run: compose -> task -> model -> train -> measure -> record.

Every run appends exactly one record, whatever happens: ``ok``, ``nan`` (diverged), ``oom``,
or ``failed`` (with the error). User mistakes found inside a run are re-raised as UserError
after recording, so the CLI prints one line and exits 2.
"""
from __future__ import annotations

import gc
import json
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from bench_cli.engine import distributed as D
from bench_cli.results import records, schema
from bench_cli.config.taskfit import build_task, check_model_fits_task
from bench_cli.engine.checkpoint import Checkpoints
from bench_cli.core.errors import UserError, warn_once
from bench_cli.core.phases import PHASES, process_age_s
from bench_cli.results.loggers import LineLogger, Loggers, make_logger
from bench_cli.engine.head_diversity import record_head_diversity
from bench_cli.engine.objective import Objective
from bench_cli.engine.trainer import Trainer, seed_everything, select_device
from bench_cli.core.files import write_atomically


def example_batch(task, split: str, batch_size: int, device) -> dict:
    """The first ``batch_size`` samples of ``split`` as one batch (the task's collate)."""
    from torch.utils.data import DataLoader

    from bench_cli.core.task import to_device

    loader = DataLoader(task.dataset(split), batch_size=batch_size, shuffle=False, collate_fn=task.collate(split))
    return to_device(next(iter(loader)), device)


def measure(task, model, cfg: DictConfig, device, objective: Objective) -> dict:
    """Parameters, FLOPs per sample and peak memory of one training step of the run's objective
    (the KSVD term included) and of one inference batch: the one measurement path
    (bench_cli.engine.measure.measure_model), as `attnbench profile` measures."""
    from bench_cli.engine import measure as M

    started = time.perf_counter()
    # one forward/backward of training: a micro-batch when the batch is accumulated (a 64 x 512-token
    # batch of the 267,744-word LM would need 35 GB of logits; training never holds it at once)
    size = min(int(cfg.trainer.batch_size), int(cfg.trainer.get("micro_batch_size") or cfg.trainer.batch_size))
    batch = example_batch(task, "train", size, device)
    flops = ("meta" if cfg.measure.get("meta_flops", False) else "real") if cfg.measure.flops else "off"
    memory = "real" if cfg.measure.memory else "off"
    cache = MeasureCache.of(cfg, model, task, batch, device, (flops, memory))
    measured = cache.load(M.count_parameters(model)) if cache else None
    if measured is None:
        with M.ValueReads() as reads:
            measured = M.measure_model(model, task.model_inputs(batch), objective.on(model, batch),
                                       task.batch_len(batch), flops=flops, memory=memory)
        if cache and not reads.seen:  # shapes alone decided the ops: the next job of these shapes reuses it
            cache.store(measured)
    out = {k: v for k, v in measured.items() if k not in ("flops_method", "memory_method")}
    samples = int(cfg.measure.get("inference_samples") or 0)
    if samples:
        out.update(inference_time(task, model, cfg, device, samples))
    out["peak_rss_bytes"] = M.process_peak_rss_bytes()
    out["measure_time_s"] = round(time.perf_counter() - started, 3)
    return out


class MeasureCache:
    """Parameters, FLOPs and peak memory of a (model, task shape), measured by one job and reused by
    the next jobs of a sweep that have the same key (other seeds, above all): the semantic model
    and task config, the example batch (its shapes, dtypes and values), the measurement modes, the
    device type, torch's version and the source of every module the model is made of, of the task
    and of the measurement. Only measurements that read no tensor value are stored
    (bench_cli.engine.measure.ValueReads): they depend on the shapes, not on the weights. One JSON file
    per key in ``.measure_cache/`` beside ``results.path``, written atomically (parallel jobs);
    ``measure.cache=false`` turns it off."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of(cls, cfg: DictConfig, model, task, batch: dict, device, modes: tuple) -> "MeasureCache | None":
        import hashlib
        import inspect

        if not cfg.measure.get("cache", True) or modes == ("off", "off"):
            return None
        import models

        # the model zoo's code (helpers included), a plugin's modules, the task's, the measurement's
        sources = set(Path(models.__file__).parent.rglob("*.py"))
        sources |= {inspect.getsourcefile(cls) for m in model.modules() for cls in type(m).__mro__
                    if not cls.__module__.startswith(("torch", "builtins"))}
        sources |= {inspect.getsourcefile(type(task)), Path(__file__).with_name("measure.py"),
                    Path(__file__).with_name("objective.py")}
        digest = hashlib.sha256()
        for part in (OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.task, resolve=True),
                     modes, device.type, torch.__version__):
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        for name in sorted(batch):
            value = batch[name]
            if torch.is_tensor(value):
                digest.update(f"{name}{tuple(value.shape)}{value.dtype}".encode())
                digest.update(value.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                digest.update(f"{name}{value!r}".encode())
        for source in sorted({Path(s) for s in sources if s}):
            digest.update(source.read_bytes())
        return cls(Path(cfg.results.path).parent / ".measure_cache" / f"{digest.hexdigest()[:32]}.json")

    def load(self, params: int) -> dict | None:
        """The entry, if it is one: a dict of numbers and strings measured on a model of ``params``
        parameters; anything else is a miss (measured again, with a warning)."""
        try:
            entry = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            entry = None
        if isinstance(entry, dict) and entry.get("params") == params and all(
                v is None or (isinstance(v, (int, float, str)) and not isinstance(v, bool)) for v in entry.values()):
            return entry
        warn_once(f"warning: measurement cache {self.path} is not an entry for this model: measured again")
        return None

    def store(self, measured: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(measured))
        except OSError:  # a read-only results folder: measured again next time
            pass


def inference_time(task, model, cfg: DictConfig, device, samples: int) -> dict:
    """Inference (eval mode, no gradients, ``trainer.precision``) over the first ``samples`` test
    samples in batches of ``eval_batch_size``, after one warm-up batch; data loading excluded.
    Pay-better-attention Table 4 reports the total over 5,000 samples (on an Apple M2):
    ``infer_time_s`` is that total (scaled to ``samples`` when the test split is smaller),
    ``infer_time_per_batch_s`` the median batch, with its quartiles. Ratios between attentions are
    what compares. Not bench_cli.engine.measure.time_rounds: each batch is new data, timed once."""
    from torch.utils.data import DataLoader

    from bench_cli.engine.measure import Spread, seconds
    from bench_cli.core.task import to_device
    from bench_cli.engine.trainer import autocast

    loader = DataLoader(task.dataset("test"), batch_size=int(cfg.trainer.eval_batch_size), shuffle=False,
                        collate_fn=task.collate("test"))
    was_training = model.training
    model.eval()
    times, seen, warm = [], 0, False
    try:
        with torch.no_grad(), autocast(device, str(cfg.trainer.get("precision", "32"))):
            for batch in loader:
                keep = min(task.batch_len(batch), samples - seen)
                batch = {k: v[:keep] for k, v in batch.items()}  # the last batch holds only what is missing
                inputs = task.model_inputs(to_device(batch, device))
                if not warm:
                    model(**inputs)
                    warm = True
                times.append(seconds(lambda: model(**inputs), device))
                seen += task.batch_len(batch)
                if seen >= samples:
                    break
    finally:
        model.train(was_training)
    if not times:
        return {}
    return {"infer_time_s": round(sum(times) * samples / seen, 6), "infer_samples": seen,
            "infer_batch_size": int(cfg.trainer.eval_batch_size),
            **Spread.of(times).columns("infer_time_per_batch_s")}


def run_experiment(cfg: DictConfig, run_dir: Path | None = None, progress=None, overrides=None,
                   run_id: str | None = None, line_prefix: str = "", columns: dict | None = None) -> dict:
    """Train and evaluate one configuration (checked beforehand: bench_cli.commands.validate); append and
    return its record (a dict; bench_cli.results.schema names its columns).

    The run folder gets ``config.yaml`` and ``run.json`` (who runs it, since when) at the start and
    ``record.json`` at the end, whatever happens; a folder without ``record.json`` is a run that
    was killed (``attnbench ls runs``). The record is written to the run folder first, then
    appended to ``results.path``; if that append fails (full disk, read-only filesystem) the run
    folder still holds it and the message says where. ``columns``: what the caller knows of the
    run that its config does not say (an Optuna trial's study and number: schema.STUDY_COLUMNS)."""
    started = time.perf_counter()
    PHASES.forget(*RUN_STAGES)
    run_id = run_id or records.new_run_id()
    run_dir = Path(run_dir or Path(cfg.paths.output_dir) / "runs" / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    # trainer.strategy=ddp: every process trains its shard; rank 0 alone measures, logs and records.
    env = D.setup(str(cfg.trainer.get("strategy", "none")), str(cfg.trainer.device))
    # resolved once (most of the config's cost): config.yaml, the record's keys and the logger read it
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if env.is_main:
        save_resolved(resolved, config_path)
    row = schema.identity(cfg, run_id=run_id, time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          config_path=config_path, output_dir=run_dir,
                          overrides=" ".join(overrides) if overrides is not None else records.command_line(),
                          keys=records.run_keys(resolved), command=records.invocation(),
                          provenance=records.provenance())
    row.update(columns or {})
    if env.is_main:
        records.write_run_marker(run_dir, row)
    loggers: list = []
    checkpoints = Checkpoints.of(cfg, row["job_key"], {k: str(row[k]) for k in ("git_commit", "attnbench_version", "torch_version")}
                                 | {"config": resolved}, started, distributed=env.world_size > 1)
    error = None
    try:
        train_and_measure(cfg, row, env, run_dir, progress, line_prefix, loggers, resolved, checkpoints)
    except (Exception, KeyboardInterrupt, SystemExit) as e:  # noqa: BLE001 - every ending is recorded, then re-raised
        error = e
    finally:
        finish(cfg, row, error, env, run_dir, started, loggers[0] if loggers else None, checkpoints)
    if isinstance(error, (UserError, KeyboardInterrupt, SystemExit)):
        raise error
    row["_error"], row["_rank"] = error, env.rank
    return row


RUN_STAGES = ("data", "model", "fit", "resume", "checkpoint", "measure", "record")  # the stages of one run (PHASES)


def write_phases(run_dir: Path, **extra) -> None:
    """``phases.json``: this process's stages in seconds and its age (exec to now), for
    `attnbench bench-overhead`'s split of the time outside training; best effort (a diagnostic)."""
    try:
        payload = {**PHASES.as_dict(), **extra, "process_age_s": process_age_s()}
        write_atomically(run_dir / "phases.json", json.dumps(payload))
    except OSError:
        pass


def save_resolved(resolved: dict, path: Path) -> None:
    """``OmegaConf.save(cfg, path, resolve=True)`` of the config ``resolved`` was resolved from: the
    same text (omegaconf.py ``to_yaml``: its YAML dumper and options), without resolving it again."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    write_atomically(path, yaml.dump(resolved, default_flow_style=False, allow_unicode=True, sort_keys=False,
                              Dumper=get_omega_conf_dumper()), encoding="utf-8")


@contextmanager
def setup_frozen():
    """While training, the setup's objects (configs, modules, datasets: far more than a bare loop
    holds) are out of the cyclic collector's sight, so its collections during training do not walk
    them again (gc.freeze); unfrozen after, so a sweep worker's next job can collect them."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def train_and_measure(cfg: DictConfig, row: dict, env, run_dir: Path, progress, line_prefix: str, loggers: list,
                      resolved: dict, checkpoints: Checkpoints | None = None) -> None:
    """Set up the task, build the model, train it (resuming from ``checkpoints``), measure it: the
    row's result columns. ``resolved``: the config resolved (the logger's copy)."""
    device = D.device_for(env, select_device(str(cfg.trainer.device)))
    row["device"] = str(device) + (f" x {env.world_size} processes" if env.world_size > 1 else "")
    if cfg.trainer.get("num_threads"):
        torch.set_num_threads(int(cfg.trainer.num_threads))
    from bench_cli.engine.measure import Conditions

    conditions = Conditions.now()  # the load before and after: a record says what its times were taken under
    with PHASES("data"):
        task = build_task(cfg)
        seed_everything(int(cfg.seed), bool(cfg.trainer.deterministic))
        task.setup(row["protocol"])
    with PHASES("model"):
        seed_everything(int(cfg.seed), bool(cfg.trainer.deterministic))  # model init independent of data loading
        model = task.build_model(cfg.model).to(device)
    if env.world_size > 1:  # same initial weights everywhere; each process its own dropout
        torch.manual_seed(int(cfg.seed) + env.rank)
    logger = None
    if env.is_main:
        tracker = make_logger(cfg.logger, resolved, run_dir,
                              name=f"{row['task']}-{row['dataset']}-{row['model']}-s{row['seed']}")
        logger = Loggers(tracker, LineLogger(task.selection_metric(), schema.protocol(row["protocol"]).selects,
                                             prefix=line_prefix))
        loggers.append(logger)
    objective = Objective.of(task, cfg.model)
    trainer = Trainer(cfg.trainer, task, model, device, int(cfg.seed), objective=objective, logger=logger,
                      progress=progress if env.is_main else None, dist=env, checkpoints=checkpoints)
    with setup_frozen(), PHASES("fit"):
        result = trainer.fit(row["protocol"])
    row.update(result.metrics)
    if env.is_main:
        with PHASES("measure"):
            row.update(schema.measurement_columns(measure(task, model, cfg, device, objective)))
            row.update(record_head_diversity(cfg, task, model, device))  # measure.head_diversity (primal-dual Table 4)
    row.update(schema.timing_columns(conditions.done(), row))
    row["metrics_json"] = {"data": task.describe(), "history": result.history}
    row["status"] = "ok"


def finish(cfg: DictConfig, row: dict, error: BaseException | None, env, run_dir: Path, started: float, logger,
           checkpoints: Checkpoints | None = None) -> None:
    """How the run ended (status, error, error.txt), its wall time (every sitting's), then the
    record: to the run folder first, then appended to ``results.path``; an ok job's checkpoints
    removed (unless kept); the loggers' summary; the processes shut down."""
    row.update(schema.ending(error))
    if error is not None and not isinstance(error, (UserError, KeyboardInterrupt, SystemExit)):
        name = "error.txt" if env.is_main else f"error_rank{env.rank}.txt"
        write_atomically(run_dir / name, "".join(traceback.format_exception(error)))
    earlier = checkpoints.earlier_wall_s if checkpoints is not None else 0.0
    row["wall_time_s"] = round(earlier + time.perf_counter() - started, 3)
    if checkpoints is not None:
        row.update(checkpoints.columns())
    else:
        row.update(sittings=1)
    if env.is_main:
        with PHASES("record"):
            write_atomically(run_dir / "record.json", json.dumps(row, indent=1, default=str))
            try:
                records.append_record(cfg.results.path, row)
            except (OSError, records.RecordsFileError) as e:  # the record is safe in the run folder; say where
                reason = e.strerror if isinstance(e, OSError) and e.strerror else e
                row["_append_error"] = f"could not append to {cfg.results.path} ({reason}); the record is in {run_dir / 'record.json'}"
        write_phases(run_dir, train_time_s=row.get("train_time_s"))
    if checkpoints is not None and env.is_main:
        checkpoints.finish(row["status"])
    if logger is not None:
        logger.log_summary({k: v for k, v in row.items() if k != "metrics_json"})
        logger.finish(row["status"])
    D.shutdown()
