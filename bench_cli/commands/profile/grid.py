"""Task mode of `attnbench profile`: the task's model (or each of ``profile.models``) and the
baseline at every point (sdpa_backend, d_model, seq_len) of the grid, measured by the harness;
one row per model and point, the baseline measured once per point and shared by its rows."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf, open_dict

from bench_cli.config import compose
from bench_cli.commands.profile.settings import int_list
from bench_cli.commands.profile import harness
from bench_cli.commands.profile.paper_table import PAPER_RATIO_COLUMNS, PaperRatios
from bench_cli.commands.profile.render import label
from bench_cli.commands.reproduce.reductions import PAPER_COLUMNS, REDUCTIONS, paper_columns

SIDES = ("model", "baseline")
# Per-side measurements, named like the run records' columns where they exist.
METRICS = (
    "params", "attn_params_per_layer", "flops_forward", "flops_train_step", "peak_mem_train_bytes",
    "peak_mem_infer_bytes", "time_train_s", "time_infer_s", "rss_train_bytes",
    "time_per_1k_steps_s",  # 1000 train steps + profile.timing.eval_batches_per_1k_steps inference batches
)
# Timed metrics: each side's median comes with its quartiles (<metric>_q1, _q3), and the ratio is the
# median of the rounds' ratios with their quartiles (ratio_<metric>_q1, _q3; bench_cli.engine.timing).
TIMED = ("time_train_s", "time_infer_s", "time_per_1k_steps_s")
QUARTILES = ("q1", "q3")
# Throughput of each side, from the median step times: samples (batch_size) and tokens (x seq_len) per second.
THROUGHPUT = ("samples_per_s_train", "tokens_per_s_train", "samples_per_s_infer", "tokens_per_s_infer")

# Today's regime beside the paper's (profile.fused_baseline): the baseline preset again, its softmax through
# torch's fused scaled_dot_product_attention kernels, and every model's ratios to it.
FUSED_COLUMNS = [
    "fused_baseline", *[f"fused_{m}" for m in METRICS], *[f"ratio_fused_{m}" for m in METRICS],
    *[f"fused_{m}_{q}" for m in TIMED for q in QUARTILES], *[f"ratio_fused_{m}_{q}" for m in TIMED for q in QUARTILES],
    *[f"fused_{m}" for m in THROUGHPUT], "fused_status", "fused_error", "fused_sdpa_kernels",
]

PROFILE_COLUMNS = [
    # identity of the point
    "run_id", "time", "status", "error", "profile", "task", "model", "attention", "baseline",
    "baseline_attention", "sdpa_backend", "d_model", "n_heads", "n_layers", "seq_len", "batch_size", "device",
    "precision", "regime",
    # measurements of each side, then the ratios model / baseline
    *[f"{side}_{m}" for side in SIDES for m in METRICS],
    *[f"ratio_{m}" for m in METRICS],
    # spreads of the times and their ratios, throughput, and what the machine was doing (noisy: why)
    *[f"{side}_{m}_{q}" for side in SIDES for m in TIMED for q in QUARTILES],
    *[f"ratio_{m}_{q}" for m in TIMED for q in QUARTILES],
    *[f"{side}_{m}" for side in SIDES for m in THROUGHPUT],
    "load_before", "load_after", "threads", "timing_noisy",
    # reductions (100 * (1 - ratio)) next to the paper's
    *[f"reduction_pct_{m}" for m in REDUCTIONS],
    *PAPER_COLUMNS,
    # ratios model / baseline printed by the paper (profile.paper: a results/paper table)
    *PAPER_RATIO_COLUMNS,
    *FUSED_COLUMNS,
    # how it was measured
    "model_status", "baseline_status", "model_error", "baseline_error", "model_attn_layers",
    "baseline_attn_layers", "model_sdpa_kernels", "baseline_sdpa_kernels", "model_timed_train_steps",
    "baseline_timed_train_steps", "fused_timed_train_steps", "flops_method", "memory_method", "timing_method",
    "process_peak_rss_bytes",
    "point_wall_time_s",
    # provenance
    "git_commit", "git_dirty", "torch_version", "attnbench_version", "python_version", "platform", "command",
]


def _with_model(cfg: DictConfig, model_cfg) -> DictConfig:
    out = cfg.copy()
    with open_dict(out):
        out.model = model_cfg
    return out


def _point_cfg(cfg: DictConfig, d_model: int | None) -> DictConfig:
    """cfg with task.backbone.d_model = d_model and the keys of profile.scale_with_d_model scaled."""
    out = cfg.copy()
    if d_model is None:
        return out
    backbone = out.task.backbone
    base = int(backbone.d_model)
    with open_dict(backbone):
        for key in cfg.profile.get("scale_with_d_model") or []:
            if key in backbone and backbone[key] is not None:
                backbone[key] = max(1, int(round(int(backbone[key]) * d_model / base)))
        backbone.d_model = d_model
    return out


def _layers(backbone) -> int:
    """The backbone's blocks: ``n_layers``, or the sum of its stacks (translation: encoder + decoder)."""
    if backbone.get("n_layers") is not None:
        return int(backbone.n_layers)
    return sum(int(v) for k, v in backbone.items() if str(k).startswith("n_") and str(k).endswith("_layers"))


def grid(cfg: DictConfig) -> list[tuple[str, int | None, int]]:
    """Points (sdpa_backend, d_model or None, seq_len), in the order they are measured."""
    p = cfg.profile
    d_models = int_list(p, "d_models", allow_null=True) or [None]
    return [(str(b), d, n) for b in p.sdpa_backends for d in d_models for n in int_list(p, "seq_lens")]


def _timed_point(cfg: DictConfig, backend: str, d_model: int | None, seq_len: int, d_default: int | None) -> bool:
    t = cfg.profile.timing
    if not t.enabled:
        return False
    if t.get("sdpa_backends") is not None and backend not in [str(b) for b in t.sdpa_backends]:
        return False
    d = d_model if d_model is not None else d_default
    if t.get("d_models") is not None and d not in int_list(t, "d_models"):
        return False
    return t.get("seq_lens") is None or seq_len in int_list(t, "seq_lens")


def _model_cfgs(cfg: DictConfig) -> list:
    """The measured models: ``model``, or every preset of ``profile.models``, each placed where
    ``model`` is so its interpolations (e.g. ${per_dataset:...}) resolve against the same root."""
    names = cfg.profile.get("models")
    if not names:
        return [cfg.model]
    return [_with_model(cfg, compose.load_option("model", str(n))).model for n in names]


def _build_side(side: harness.Side, cfg: DictConfig, task, seq_len: int, device) -> None:
    """The side's model, its synthetic batch and the run's objective on it; its optimiser, lr
    scheduler and GradScaler as the trainer makes them (bench_cli.engine.trainer.Trainer.optimisation);
    the papers' regime of its attention (profile.regime; not for the fused side: today's)."""
    import torch

    from bench_cli.engine.attention_regime import apply_attention_regime
    from bench_cli.engine.env import seed_everything
    from bench_cli.engine.objective import Objective
    from bench_cli.engine.optim import make_optimizer, make_scheduler, parameter_groups

    p, trainer = cfg.profile, cfg.trainer
    seed_everything(int(cfg.seed), False)
    side.module = task.build_model(side.model_cfg).to(device)
    side.device, side.precision = device, str(trainer.get("precision", "32"))
    if side.role != "fused":
        regime = p.get("regime") or {}
        apply_attention_regime(side.module, float32=bool(regime.get("attention_float32")),
                               checkpointed=str(side.model_cfg.attention.name) in
                               [str(a) for a in regime.get("checkpoint_attention") or []])
    batch = task.synthetic_batch(int(p.batch_size), seq_len, device)
    side.inputs = task.model_inputs(batch)
    side.loss_fn = Objective.of(task, side.model_cfg).on(side.module, batch)  # the run's objective
    side.scaler = torch.amp.GradScaler(device.type, enabled=side.precision == "fp16")
    if p.timing.get("optimizer"):  # the trainer's optimiser (trainer.optimizer), stepped by every timed train step
        o = trainer.optimizer
        side.optimizer = make_optimizer(parameter_groups(side.module, float(o.get("weight_decay", 0.0)),
                                                         bool(o.get("no_decay_1d", False))), o)
        if _steps_scheduler(cfg):  # trainer.scheduler over trainer.max_steps (the LRA code's OneCycleLR)
            total = int(trainer.get("max_steps") or 1000)
            side.scheduler = make_scheduler(side.optimizer, trainer.scheduler, total, total)


def _sides(cfg: DictConfig) -> list[tuple[str, object]]:
    """(role, model config) of every side of a point: each measured model, the baseline, and the
    fused baseline (profile.fused_baseline)."""
    sides = [("model", m) for m in _model_cfgs(cfg)]
    if cfg.get("baseline") is not None:
        sides.append(("baseline", _with_model(cfg, compose.load_option("model", str(cfg.baseline))).model))
    if cfg.profile.get("fused_baseline") is not None:
        sides.append(("fused", _with_model(cfg, compose.load_option("model", str(cfg.profile.fused_baseline))).model))
    return sides


def _measure_point(cfg: DictConfig, side_cfgs, task, backend: str, seq_len: int, device, budget_bytes,
                   timed: bool) -> list[harness.Side]:
    """Build and measure every side at one point; time them together when ``timed``. The fused
    side runs under ``auto`` (torch's choice among its fused kernels), the others under ``backend``."""
    from bench_cli.commands.profile.steps import time_sides

    p = cfg.profile
    sides = [harness.Side(role, mcfg, harness.Budget(p.get("timeout_s")),
                          backend="auto" if role == "fused" else backend)
             for role, mcfg in side_cfgs]
    for side in sides:
        harness.guarded(side, "build", lambda side=side: _build_side(side, cfg, task, seq_len, device),
                        p.get("timeout_s"))
        harness.guarded(side, "measure", lambda side=side: harness.measure_static(
            side, int(p.batch_size), str(p.flops), str(p.memory), device, budget_bytes), p.get("timeout_s"))
    if timed:
        time_sides([s for s in sides if s.ok], p.timing, device, p.get("timeout_s"),
                   bool((p.get("regime") or {}).get("memory_over_timed_steps")))
    return sides


def run_profile(cfg: DictConfig, on_row: Callable[[dict], None] | None = None, progress=None,
                command: str = "", run_id: str | None = None) -> list[dict]:
    """Measure every point of the grid for each model and ``cfg.baseline``; return the rows
    (and hand each to ``on_row`` as soon as it is complete); ``run_id``: the rows' (default: a new one)."""
    import torch

    from bench_cli.results.provenance import provenance
    from bench_cli.results.run_folder import new_run_id
    from bench_cli.config.taskfit import build_task, check_model_fits_task
    from bench_cli.engine.counting import process_peak_rss_bytes
    from bench_cli.engine.env import check_hardware, select_device
    from bench_cli.engine.timing import TimingSession

    p = cfg.profile
    check_hardware(cfg)  # trainer.precision=fp16 needs CUDA, as a run says it
    device = select_device(str(cfg.trainer.device))
    if cfg.trainer.get("num_threads"):
        torch.set_num_threads(int(cfg.trainer.num_threads))
    budget_bytes = harness.memory_budget_bytes(p.get("memory_budget_gb"), device)
    side_cfgs = _sides(cfg)
    for _, mcfg in side_cfgs:
        check_model_fits_task(build_task(cfg), _with_model(cfg, mcfg))
    d_default = int(cfg.task.backbone.d_model) if "backbone" in cfg.task and "d_model" in cfg.task.backbone else None
    points = grid(cfg)
    bar = progress.add_task(label(p.name), total=len(points), status="") if progress else None
    prov = provenance()
    run_id = run_id or new_run_id()
    reference = [OmegaConf.to_container(r, resolve=True) for r in (p.get("reference") or [])]
    paper = PaperRatios.of(p.get("paper"))
    rows = []
    for backend, d_model, seq_len in points:
        started = time.perf_counter()
        pcfg = _point_cfg(cfg, d_model)
        task = build_task(pcfg)
        task.setup_synthetic(seq_len)
        if progress:
            progress.update(bar, status=f"{backend} d={d_model or d_default} N={seq_len}")
        timed = _timed_point(cfg, backend, d_model, seq_len, d_default)
        session = TimingSession()
        sides = _measure_point(cfg, side_cfgs, task, backend, seq_len, device, budget_bytes, timed)
        session.done()
        baseline = next((s for s in sides if s.role == "baseline"), None)
        fused = next((s for s in sides if s.role == "fused"), None)
        for side in (s for s in sides if s.role == "model"):
            row = _row(cfg, pcfg, side, baseline, backend, seq_len, device, prov, run_id, command, timed)
            row.update(_fused_columns(side, fused, int(p.batch_size) * seq_len, int(p.batch_size), timed))
            if timed:
                row.update(_timing_columns(side, baseline, int(p.batch_size) * seq_len, int(p.batch_size), session))
            row.update(paper_columns(reference, row["d_model"], seq_len, backend))
            row.update(paper.columns(row))
            row["process_peak_rss_bytes"] = process_peak_rss_bytes()
            row["point_wall_time_s"] = round(time.perf_counter() - started, 3)
            rows.append(row)
            if on_row:
                on_row(row)
        for side in sides:  # free the point's models before the next one
            side.module = side.inputs = side.loss_fn = side.optimizer = side.scheduler = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if progress:
            progress.advance(bar)
    return rows


def _throughput(side: harness.Side, tokens: int, samples: int, prefix: str) -> dict:
    out = {}
    for step in ("train", "infer"):
        t = side.metrics.get(f"time_{step}_s")
        out[f"{prefix}_samples_per_s_{step}"] = samples / t if t else None
        out[f"{prefix}_tokens_per_s_{step}"] = tokens / t if t else None
    return out


def _fused_columns(model: harness.Side, fused: harness.Side | None, tokens: int, samples: int, timed: bool) -> dict:
    """The fused baseline's measurements, every model's ratios to it (the time ratios the median
    of the rounds' ratios, with their quartiles) and the kernels it ran; {} without one."""
    from bench_cli.engine.timing import ratio_spread

    if fused is None:
        return {}
    out = {"fused_baseline": str(fused.model_cfg.name), "fused_status": fused.status, "fused_error": fused.error,
           "fused_sdpa_kernels": _kernels_text(fused), "fused_timed_train_steps": fused.metrics.get("timed_train_steps")}
    for m in METRICS:
        out[f"fused_{m}"] = fused.metrics.get(m)
        out[f"ratio_fused_{m}"] = _ratio(model.metrics.get(m), fused.metrics.get(m)) if model.ok else None
    if timed and fused.ok:
        for m in TIMED:
            out.update({f"fused_{m}_{q}": fused.metrics.get(f"{m}_{q}") for q in QUARTILES})
        out.update(_throughput(fused, tokens, samples, "fused"))
        if model.ok and model.rounds.get("time_train_s") and fused.rounds.get("time_train_s"):
            for m in TIMED:
                out.update(ratio_spread(model.rounds[m], fused.rounds[m]).columns(f"ratio_fused_{m}", digits=9))
    return out


def _kernels_text(side: harness.Side) -> str:
    """'train: math; infer: flash_attention_for_cpu' (what the side's warm-up ran; '' untimed or
    without scaled_dot_product_attention)."""
    kernels = side.kernels or {}
    if not any(kernels.values()):
        return ""
    return "; ".join(f"{step}: {ran or '-'}" for step, ran in kernels.items())


def _timing_columns(model: harness.Side, baseline: harness.Side | None, tokens: int, samples: int, session) -> dict:
    """Quartiles of the timed metrics and of their round-by-round ratios, throughput, the load and
    threads, and ``timing_noisy`` (why the times are not to be trusted; empty when they are)."""
    from bench_cli.engine.timing import ratio_spread

    out, spreads = {}, []
    sides = [s for s in (model, baseline) if s is not None and s.ok]
    for side in sides:
        for q in QUARTILES:
            out.update({f"{side.role}_{m}_{q}": side.metrics.get(f"{m}_{q}") for m in TIMED})
        out.update(_throughput(side, tokens, samples, side.role))
    if len(sides) == 2 and model.rounds.get("time_train_s") and baseline.rounds.get("time_train_s"):
        for m in TIMED:
            ratio = ratio_spread(model.rounds[m], baseline.rounds[m])
            spreads.append(ratio)
            out.update(ratio.columns(f"ratio_{m}", digits=9))
    return {**out, **session.columns(spreads)}


def _ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


def _row(cfg, pcfg, model: harness.Side, baseline: harness.Side | None, backend, seq_len, device, prov, run_id, command,
         timed: bool) -> dict:
    import torch

    from bench_cli.engine.timing import timer_name
    from bench_cli.results.schema import model_name

    p = cfg.profile
    b = pcfg.task.backbone
    t = p.timing
    row = {
        "run_id": run_id, "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profile": str(p.name), "task": str(cfg.task.name), "model": model_name(_with_model(cfg, model.model_cfg)),
        "attention": str(model.model_cfg.attention.name),
        "baseline": str(cfg.baseline) if baseline is not None else "",
        "baseline_attention": str(baseline.model_cfg.attention.name) if baseline is not None else "",
        "sdpa_backend": backend, "d_model": int(b.d_model), "n_heads": int(b.n_heads), "n_layers": _layers(b),
        "seq_len": seq_len, "batch_size": int(p.batch_size), "device": str(device),
        "precision": str(cfg.trainer.get("precision", "32")), "regime": regime_text(cfg),
        "timing_method": (f"warmup={t.warmup}, median of >= {t.repeats} alternating rounds"
                          + (f" of {t.steps_per_round} train steps" if int(t.get("steps_per_round") or 1) > 1 else "")
                          + f" (until IQR <= 5% or "
                          f"{t.get('budget_s') or 0} s), ratios: median of the rounds' ratios, "
                          f"{torch.get_num_threads()} thread(s), {timer_name(device)}"
                          + (f", train step with {cfg.trainer.optimizer.name} step" if t.get("optimizer") else "")
                          + (f" and {cfg.trainer.scheduler.name} scheduler step" if _steps_scheduler(cfg) else "")
                          + (f", per 1K steps: 1000 train steps + {t.eval_batches_per_1k_steps} inference batches"
                             if t.get("eval_batches_per_1k_steps") else "") if timed else "not timed"),
        "command": command,
        **prov,
    }
    sides = [s for s in (model, baseline) if s is not None]
    for side in sides:
        for m in METRICS:
            row[f"{side.role}_{m}"] = side.metrics.get(m)
        row[f"{side.role}_attn_layers"] = side.metrics.get("attn_layers")
        row[f"{side.role}_status"], row[f"{side.role}_error"] = side.status, side.error
        row[f"{side.role}_sdpa_kernels"] = _kernels_text(side)
        row[f"{side.role}_timed_train_steps"] = side.metrics.get("timed_train_steps")
        for k in ("flops_method", "memory_method"):
            if side.metrics.get(k) and not row.get(k):
                row[k] = side.metrics[k]
    bad = [s for s in sides if not s.ok]
    row["status"] = bad[0].status if bad else "ok"
    row["error"] = "; ".join(f"{s.role}: {s.error}" for s in bad)
    if baseline is not None:
        for m in METRICS:
            row[f"ratio_{m}"] = _ratio(row.get(f"model_{m}"), row.get(f"baseline_{m}"))
        for m in REDUCTIONS:
            r = row.get(f"ratio_{m}")
            row[f"reduction_pct_{m}"] = None if r is None else 100.0 * (1.0 - r)
    return row


def regime_text(cfg: DictConfig) -> str:
    """How the steps ran, in a few words: the precision and the papers' regime (profile.regime),
    for the row, the table's title, the plot and the report."""
    regime, timing = cfg.profile.get("regime") or {}, cfg.profile.timing
    precision = str(cfg.trainer.get("precision", "32"))
    parts = [{"32": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast + GradScaler"}.get(precision, precision)]
    if regime.get("attention_float32"):
        parts.append("attention kernels in float32")
    if regime.get("checkpoint_attention"):
        parts.append("checkpointed attention: " + ", ".join(str(a) for a in regime.checkpoint_attention))
    if timing.get("optimizer"):
        parts.append(f"{cfg.trainer.optimizer.name}" + (f" + {cfg.trainer.scheduler.name}" if _steps_scheduler(cfg)
                                                         else "") + " step in the timed step")
    if regime.get("memory_over_timed_steps"):
        parts.append("memory: allocator peak over the timed steps (CUDA)")
    return "; ".join(parts)


def _steps_scheduler(cfg: DictConfig) -> bool:
    """A timed step takes an lr scheduler's step: profile.timing.optimizer and .scheduler, and a trainer.scheduler."""
    timing = cfg.profile.timing
    return bool(timing.get("optimizer") and timing.get("scheduler")) and str(cfg.trainer.scheduler.name) != "none"
