"""What `attnbench profile` shows: the title, the table of ratios (task mode), and where its
plot goes. The papers' numbers next to ours come from :mod:`bench_cli.commands.reproduce`."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig


def label(name: str) -> str:
    """'profile' or 'profile figure1': the command and the preset's ``profile.name``, said once."""
    return "profile" if str(name) == "profile" else f"profile {name}"


def model_names(cfg: DictConfig) -> list[str]:
    """The measured models as their rows, titles and files name them: ``profile.models``, or
    ``model`` named after what runs (``model=softmax model.attention.name=elu_linear`` is elu_linear,
    a plugin's attention its own name: bench_cli.results.schema.model_name)."""
    from bench_cli.results.schema import model_name

    return [str(m) for m in cfg.profile.get("models") or [model_name(cfg)]]


def precision(cfg: DictConfig) -> str:
    """'float32', 'bf16' or 'fp16': trainer.precision, as a title says it."""
    value = str(cfg.trainer.get("precision", "32"))
    return "float32" if value == "32" else value


def title(cfg: DictConfig, device: str) -> str:
    fused = cfg.profile.get("fused_baseline")
    return (f"{label(cfg.profile.name)}: {', '.join(model_names(cfg))} vs {cfg.get('baseline') or '-'}"
            + (f" and fused {fused}" if fused else "") + f" on {cfg.task.name} ({device}, {precision(cfg)})")


def figure_titles(cfg: DictConfig, model: str, rows: list[dict]) -> tuple[str, str]:
    """(title, subtitle) of one model's figure: the preset's ``profile.figure_title`` (the paper's
    name for it) or one made from the names; the subtitle says what was measured on what."""
    base = cfg.get("baseline") or "-"
    title = cfg.profile.get("figure_title") or f"{model} / {base}: cost ratios vs sequence length"
    first = rows[0] if rows else {}
    subtitle = (f"model {model}, baseline {base}, on synthetic {cfg.task.name} inputs (batch "
                f"{first.get('batch_size', '-')}, {first.get('device', '-')}, {precision(cfg)}); "
                "ratio 1 = as costly as the baseline")
    return title, subtitle


def fmt(v, kind: str = "") -> str:
    from bench_cli.core.ui import human

    if v in (None, ""):
        return "-"
    if kind == "ratio":
        return f"{float(v):.3f}"
    if kind == "num":
        return f"{float(v):.1f}"
    if kind == "s":
        return f"{float(v):.3g}s"
    return human(v, kind)


def print_task_table(rows: list[dict], title: str) -> None:
    """Ratios model/baseline per point (absolute values are in the CSV), then the measured
    reductions next to the paper's where the profile has them, then the points that failed."""
    from bench_cli.commands.reproduce.reductions import comparison_lines
    from bench_cli.core.ui import console, human, show_table

    cols = (("FLOPs fwd", "flops_forward"), ("FLOPs train", "flops_train_step"), ("mem train", "peak_mem_train_bytes"),
            ("mem infer", "peak_mem_infer_bytes"), ("time train", "time_train_s"), ("time infer", "time_infer_s"),
            ("params", "params"))
    cols += (("time / 1K steps", "time_per_1k_steps_s"),) if any(r.get("ratio_time_per_1k_steps_s") for r in rows) else ()
    if any(r.get("ratio_fused_time_train_s") for r in rows):  # today's baseline: softmax through the fused kernels
        cols += (("time train / fused", "fused_time_train_s"), ("mem train / fused", "fused_peak_mem_train_bytes"))
    from bench_cli.core.spread import NOISY_NOTE, interval_text

    several = len({r["model"] for r in rows}) > 1
    headers = [*(["model"] if several else []), "sdpa", "D", "N", "status", *[c for c, _ in cols], "model FLOPs train",
               "model mem train", "model tok/s train", "model tok/s infer"]
    table = []
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"[red]{r['status']}[/]"
        if r.get("timing_noisy"):
            status += " [red]noisy[/]"
        table.append([*([r["model"]] if several else []), r["sdpa_backend"], str(r["d_model"]), str(r["seq_len"]), status,
                      *[interval_text(r, f"ratio_{m}", "{:.3f}") if "time" in m else fmt(r.get(f"ratio_{m}"), "ratio")
                        for _, m in cols],
                      human(r.get("model_flops_train_step")) if r.get("model_flops_train_step") is not None else "-",
                      human(r.get("model_peak_mem_train_bytes"), "B") if r.get("model_peak_mem_train_bytes") is not None else "-",
                      fmt(r.get("model_tokens_per_s_train"), "num"), fmt(r.get("model_tokens_per_s_infer"), "num")])
    # as wide as the numbers need, or one block per point when the console is narrower: never folded digits
    show_table(title, headers, table,
               caption="ratio model / baseline (FLOPs per sample, memory per batch); times: median of the rounds' "
                       "ratios and, in brackets, their IQR; tok/s: batch x N tokens per second; values in the CSV")
    timed = [r for r in rows if r.get("load_before") not in (None, "")]
    if timed:
        r = timed[-1]
        console.print(f"load average (1 min) before {r['load_before']}, after {r['load_after']} (last timed point); "
                      f"{r['threads']} thread(s)", highlight=False)
    for r in rows:
        if r.get("timing_noisy"):
            console.print(f"[red]{NOISY_NOTE}[/] {r['model']} D={r['d_model']} N={r['seq_len']}: "
                          f"{str(r['timing_noisy']).removeprefix(NOISY_NOTE).strip(' ()')}", highlight=False)
    for line in kernel_lines(rows):
        console.print(line, highlight=False)
    for line in comparison_lines(rows, fmt):
        console.print(line, highlight=False)
    for r in rows:
        if r["status"] != "ok":
            console.print(f"[red]{r['status']}[/] {r['model']} D={r['d_model']} N={r['seq_len']} sdpa={r['sdpa_backend']}: "
                          f"{r['error']}", highlight=False)


def plot_paths(cfg: DictConfig) -> list[tuple[str, Path]]:
    """(model, plot) for every measured model. ``profile.plot``: auto = beside the CSV, named
    <output>_<task>_<model>_vs_<baseline>.png; a path (one model only); null: none."""
    p = cfg.profile
    plot = p.get("plot")
    if plot in (None, False, "", "none", "null"):
        return []
    if plot != "auto":
        return [(model_names(cfg)[0], Path(str(plot)))]
    out = Path(str(p.output))
    base = f"{cfg.baseline}" if cfg.get("baseline") is not None else "none"
    return [(m, out.with_name(f"{out.stem}_{cfg.task.name}_{m}_vs_{base}.png")) for m in model_names(cfg)]


def kernel_lines(rows: list[dict]) -> list[str]:
    """'SDPA kernels that ran (not those asked for): baseline softmax (sdpa math): train: math; ...'
    once per distinct combination, from the rows' *_sdpa_kernels columns (bench_cli.engine.sdpa_kernels)."""
    seen: dict[str, None] = {}
    for r in rows:
        parts = [f"{name} ({how}): {r[key]}" for name, how, key in (
            (f"baseline {r.get('baseline')}", f"sdpa {r.get('sdpa_backend')}", "baseline_sdpa_kernels"),
            (f"fused {r.get('fused_baseline')}", "sdpa auto", "fused_sdpa_kernels")) if r.get(key)]
        if parts:
            seen["SDPA kernels that ran (not those asked for): " + "; ".join(parts)] = None
    return list(seen)
