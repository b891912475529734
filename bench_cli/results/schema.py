"""The result schema: the one place that names record columns and turns a run into its row.

A run's row is built from four parts, each a function here: who the run is (``identity``), what
training and evaluation gave (``fit_columns``, from the trainer's history), what was measured
(``measurement_columns``) and how it ended (``ending``). The protocol resolves into splits here
too (``protocol``), so the trainer, the per-evaluation lines and the record agree on which split
selects. Columns are only ever added, never renamed (csv_store.py writes them; report reads them).

Protocols (recorded in every result):
- ``holdout``: a validation split carved from TRAIN selects the evaluation (the best value of the
  selection metric, ties to the lower loss); the test metrics of those weights are reported.
- ``paper``: what the papers' code reported from its test evaluations: the best one (highest
  accuracy, lowest RMSE...; optimistic: the test set selects the model) or, by the task's
  ``paper_selection: last``, the last one (keras' fit). Reported under this name only.
The ``selection`` column says which ('best val', 'best test', 'last test'; Task.resolve_protocol).
"""
from __future__ import annotations


# One schema for every task (DESIGN.md): identity, metrics, provenance. Task-specific extras go
# to `metrics_json`. Columns are only ever added, never renamed.
COLUMNS = [
    # identity
    "run_id", "time", "status", "error", "task", "dataset", "model", "attention", "seed", "protocol",
    "experiment", "config_hash", "job_key", "variant_key",
    # task metric (classification's names, the first schema's; every task also writes the generic
    # columns below, and test_<name> for each metric it declares, e.g. test_rmse, test_top5_accuracy)
    "test_accuracy", "val_accuracy", "best_epoch", "epochs_run", "test_accuracy_last", "test_loss",
    "metric", "higher_is_better", "val_score", "test_score", "test_score_last",
    # efficiency
    "params", "attn_params", "attn_params_per_layer", "flops_forward", "flops_train_step",
    "peak_mem_train_bytes", "peak_mem_infer_bytes", "peak_rss_bytes", "train_time_s", "time_per_epoch_s",
    "wall_time_s", "device",
    # seconds the measurement above took (FLOPs, memory, inference timing; a cached measurement is quick)
    "measure_time_s",
    # head diversity (measure.head_diversity; bench_cli/engine/head_diversity.py): primal-dual Table 4
    "head_l2_distance_mean", "head_l2_distance_std",
    # provenance
    "git_commit", "git_dirty", "torch_version", "attnbench_version", "python_version", "platform",
    "config_path", "output_dir", "overrides", "metrics_json", "command",
    # the schedule: planned and run (a report reads these instead of recomposing the config)
    "epochs_planned", "steps_planned", "steps_run", "step_budget", "train_metrics_source",
    # the plugins of the run's process (bench_cli/config/plugins.py): 'mymod==1.2 (module mymod)', or empty
    "plugins",
    # which evaluation the protocol reported (bench_cli.core.task.Protocol.selection): 'best val',
    # 'best test' or 'last test' (the paper protocol as the reference code: task.paper_selection)
    "selection",
    # checkpoints and resume (bench_cli/engine/checkpoint.py): the checkpoint the run continued from (empty:
    # from the start) and its epoch and optimiser step, in how many sittings it ran (time columns add them
    # up), the job's checkpoint folder and its size when the run ended (an ok job's is then removed unless keep_final)
    "resumed_from", "resumed_epoch", "resumed_step", "sittings", "checkpoint_dir", "checkpoint_bytes",
]
# timing (bench_cli.engine.timing): the per-epoch time's quartiles over the epochs (its median is
# time_per_epoch_s) and the inference batches', the 1-minute load average before and after the run,
# torch's threads, and why the run's times are not to be trusted ('' when they are)
TIMING_COLUMNS = ["time_per_epoch_s_q1", "time_per_epoch_s_q3", "infer_time_per_batch_s_q1",
                  "infer_time_per_batch_s_q3", "load_before", "load_after", "threads", "timing_noisy"]
COLUMNS += TIMING_COLUMNS
# an Optuna sweep's trial (bench_cli/commands/study.py): the study's name and the trial's number in it;
# empty for every other run
STUDY_COLUMNS = ["study", "trial"]
# a confirmation run of an Optuna sweep (tuning.confirm_top): the trial whose setting it reruns with another seed
STUDY_COLUMNS += ["confirms_trial"]
COLUMNS += STUDY_COLUMNS
# the code that made the record (bench_cli/results/code_identity.py): {module: sha256 of its source} of the
# plugins, the attention's and the task's modules, as JSON; a sweep reruns a job whose plugin changed since
CODE_COLUMNS = ["code_hashes"]
COLUMNS += CODE_COLUMNS
# how many test samples' outputs (prediction, target, loss) samples.npz of the run folder holds
# (bench_cli/results/samples.py; empty: none kept), for paired comparisons of two models
SAMPLE_COLUMNS = ["test_samples"]
COLUMNS += SAMPLE_COLUMNS
# what the run trained and evaluated in (trainer.precision, bench_cli/engine/env.py): '32', 'bf16' (autocast)
# or 'fp16' (autocast + GradScaler); beside `device`, so a record says its precision without its config file
PRECISION_COLUMNS = ["precision"]
COLUMNS += PRECISION_COLUMNS
# Fewer epochs (or inference batches) than this do not judge the spread: one slow epoch (the first
# one's warm-up) moves the IQR of four.
SPREAD_MIN_N = 5
IDENTITY = ("run_id", "time", "status", "error", "task")  # the first columns of every record file
STATUSES = ("ok", "failed", "nan", "oom", "timeout", "interrupted", "pruned")


from bench_cli.core.protocols import PROTOCOL_SPLITS as PROTOCOLS, Protocol  # noqa: E402  (the task contract's, torch-free)


def protocol(name: str) -> Protocol:
    from bench_cli.core.errors import unknown_choice

    if name not in PROTOCOLS:
        raise unknown_choice("protocol", name, PROTOCOLS)
    return PROTOCOLS[name]


def _prefixed(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}_{k}": v for k, v in metrics.items()}


def _unprefixed(prefix: str, row: dict) -> dict:
    return {k[len(prefix) + 1:]: v for k, v in row.items() if k.startswith(prefix + "_")}


def fit_columns(result) -> dict:
    """The columns of a finished fit (bench_cli.engine.trainer.TrainResult): the selected evaluation's
    metrics under the protocol, the last evaluation's, the schedule planned and run."""
    metric, proto = result.metric, result.protocol
    chosen = result.selected_row()
    if proto.holds_out:
        test, last = result.test, result.test_last
    else:  # the best evaluation on TEST is the reported number (optimistic by construction)
        test, last = _unprefixed("test", chosen), _unprefixed("test", result.history[-1])
    row = {"selection": proto.selection, "best_epoch": result.best_epoch, "epochs_run": result.epochs_run,
           "epochs_planned": result.epochs_planned, "steps_planned": result.steps_planned,
           "steps_run": result.steps_run, "step_budget": result.step_budget,
           "train_metrics_source": result.train_metrics_source,
           "train_time_s": round(result.train_time_s, 3), **epoch_time_columns(result)}
    if result.by_steps:
        row["best_step"] = result.best_step
    if proto.holds_out:
        row[f"val_{metric.name}"] = row["val_score"] = chosen[f"val_{metric.name}"]
    row.update(metric=metric.name, higher_is_better=metric.higher_is_better, test_score=test[metric.name],
               test_score_last=last[metric.name])
    row[f"test_{metric.name}_last"] = last[metric.name]
    row.update(_prefixed("test", test))
    for split, metrics in result.splits.items():
        row.update(_prefixed(split, metrics))
    if result.train_metrics_source == "batches":  # the training metrics of the reported evaluation
        row.update({k: v for k, v in chosen.items() if k.startswith("train_")})
    return row


def epoch_time_columns(result) -> dict:
    """``time_per_epoch_s``: the median of the epochs' training seconds, with its quartiles (one
    slow epoch is spread, not a slower model); total / epochs for a result without them."""
    from bench_cli.core.spread import Spread

    times = getattr(result, "epoch_times_s", None)
    if not times:
        return {"time_per_epoch_s": round(result.train_time_s / max(result.epochs_run, 1), 4)}
    return Spread.of(times).columns("time_per_epoch_s", 4)


def timing_columns(conditions, row: dict) -> dict:
    """The load, threads and ``timing_noisy`` of a run (``conditions``: bench_cli.engine.timing.Conditions,
    done): noisy when the load exceeded the cores or the epochs' or inference batches' IQR is wide."""
    from bench_cli.core.spread import Spread

    counts = {"time_per_epoch_s": row.get("epochs_run") or 0,
              "infer_time_per_batch_s": -(-(row.get("infer_samples") or 0) // (row.get("infer_batch_size") or 1))}
    spreads = [Spread(row[k], row[f"{k}_q1"], row[f"{k}_q3"], n) for k, n in counts.items()
               if n >= SPREAD_MIN_N and row.get(k) is not None and row.get(f"{k}_q1") is not None]
    return {**conditions.columns(), "timing_noisy": conditions.noise(spreads)}


def measurement_columns(measured: dict) -> dict:
    """What bench_cli.engine.counting and .measure gave, under the record's names (FLOPs per sample; whole numbers as
    integers, as the records always held them)."""
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in measured.items()}


def ending(error: BaseException | None) -> dict:
    """``status`` and ``error`` of a run that ended with ``error`` (None: ok)."""
    from bench_cli.core.errors import DivergedError, PrunedError, interruption_name
    from bench_cli.core.errors import is_oom

    if error is None:
        return {"status": "ok"}
    if isinstance(error, KeyboardInterrupt):
        return {"status": "interrupted", "error": f"interrupted ({interruption_name(error)})"}
    if isinstance(error, SystemExit):  # sys.exit inside the run: a launcher's signal handler (submitit's requeue)
        return {"status": "interrupted", "error": f"interrupted ({getattr(error, 'signal_name', f'exit {error.code}')})"}
    status = ("nan" if isinstance(error, DivergedError) else "pruned" if isinstance(error, PrunedError)
              else "oom" if is_oom(error) else "failed")
    return {"status": status, "error": f"{type(error).__name__}: {error}".splitlines()[0][:500]}


def model_name(cfg) -> str:
    """What was run: the model preset's name, or the attention's when the run swapped the preset's
    own attention for another (``model=softmax model.attention.name=elu_linear`` is elu_linear, not
    softmax). A model whose name is no preset (a plugin's YAML, ``model.name=...``) keeps its name."""
    from bench_cli.config import compose

    name, attention = str(cfg.model.name), str(cfg.model.attention.name)
    if name == attention or not compose.option_file("model", name).is_file():
        return name
    preset = compose.load_option("model", name)
    own = preset.get("attention", {}).get("name") if preset.get("attention") else None
    return name if own is None or str(own) == attention else attention


def identity(cfg, *, run_id: str, time: str, config_path, output_dir, overrides: str, keys: tuple[str, str, str],
             command: str, provenance: dict) -> dict:
    """The columns that say which run this is: from its composed config, its keys (config hash, job
    key, variant key: bench_cli.results.job_keys), the command and the provenance; status failed until it ends."""
    from omegaconf import OmegaConf

    config_hash, job_key, variant_key = keys
    return {
        "run_id": run_id, "time": time, "status": "failed",
        "task": cfg.task.name, "dataset": cfg.task.get("dataset", cfg.task.name),
        "model": model_name(cfg), "attention": cfg.model.attention.name, "seed": int(cfg.seed),
        "protocol": str(cfg.task.get("protocol", "holdout")),
        "experiment": OmegaConf.select(cfg, "experiment_name", default="") or "",
        "config_hash": config_hash, "job_key": job_key, "variant_key": variant_key,
        "config_path": str(config_path), "output_dir": str(output_dir), "overrides": overrides,
        "command": command, **provenance,
    }
