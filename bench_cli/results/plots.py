"""Plots of `attnbench profile` (matplotlib, Agg backend, PNG).

* :func:`ratio_figure`: the axes of the primal-dual efficiency figures (Figures 1-4 of
  papers/000): ratio model/baseline vs sequence length, one line per d_model (one line style per
  SDPA backend), FLOPs and memory side by side, training on top and inference below. The
  paper's numbers, when the profile has them, are drawn as stars.
* :func:`pba_figures`: papers/002 Figures 2-4 from the counted FLOPs of one attention layer,
  each next to the paper's Eqn. (24).
* :func:`zoo_figure`: the attention zoo's per-task plot (bench_cli/results/report/zoo.py), in the form of
  the LRA paper's Figure 3 (Tay et al. 2021): score against speed, one labelled point per model,
  its area by memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _num(v):
    try:
        return None if v in (None, "") else float(v)
    except (TypeError, ValueError):
        return None


PANELS = (
    ("flops_train_step", "FLOPs ratio, training step"),
    ("peak_mem_train_bytes", "memory ratio, training step"),
    ("flops_forward", "FLOPs ratio, inference"),
    ("peak_mem_infer_bytes", "memory ratio, inference"),
)
_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "v")


def ratio_figure(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Ratios model/baseline vs sequence length (log2 axis), one line per (d_model, backend)."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    backends = list(dict.fromkeys(str(r["sdpa_backend"]) for r in rows))
    d_models = sorted({int(r["d_model"]) for r in rows})
    colors = plt.get_cmap("viridis")
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, (metric, label) in zip(axes.flat, PANELS):
        for bi, backend in enumerate(backends):
            for di, d in enumerate(d_models):
                pts = sorted((int(r["seq_len"]), _num(r.get(f"ratio_{metric}"))) for r in rows
                             if str(r["sdpa_backend"]) == backend and int(r["d_model"]) == d)
                pts = [(n, v) for n, v in pts if v is not None]
                if not pts:
                    continue
                color = colors(di / max(len(d_models) - 1, 1) * 0.85)
                name = f"D={d}" + (f", sdpa={backend}" if len(backends) > 1 else "")
                ax.plot([n for n, _ in pts], [v for _, v in pts], _STYLES[bi % len(_STYLES)],
                        marker=_MARKERS[bi % len(_MARKERS)], markersize=6 - 2 * (bi % 2), color=color, label=name)
        for r in rows:
            paper = _num(r.get(f"paper_reduction_pct_{metric}"))
            if paper is not None:
                ax.plot([int(r["seq_len"])], [1 - paper / 100], marker="*", markersize=15, color="crimson",
                        linestyle="none", label=f"paper (D={r['d_model']}, N={r['seq_len']})")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(label)
        ax.set_ylabel("model / baseline")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        if unique:
            ax.legend(unique.values(), unique.keys(), fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("sequence length N")
    seq = sorted({int(r["seq_len"]) for r in rows})
    for ax in axes.flat:
        ax.set_xticks(seq)
        ax.set_xticklabels([str(n) for n in seq])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- papers/002


def _select(rows, **kw):
    return [r for r in rows if all(str(r[k]) == str(v) for k, v in kw.items())]


def pba_figures(rows: list[dict], figures, c_attn: dict) -> list[Path]:
    """papers/002 Figure 2 (FLOPs vs d_m at fixed l), Figure 3 (heatmaps of standard/efficient
    FLOPs per number of heads) and Figure 4 (FLOPs over (l, d_m), one head), counted next to Eqn. (24)."""
    plt = _pyplot()
    backend = str(figures.get("backend", "auto"))
    rows = _select(rows, sdpa_backend=backend)
    variants = list(dict.fromkeys(r["model"] for r in rows))
    out = []
    f2, f3, f4 = figures.get("figure2"), figures.get("figure3"), figures.get("figure4")
    if f2 and _select(rows, seq_len=f2["seq_len"], heads=f2["heads"]):
        out.append(_pba_figure2(plt, rows, f2, variants, c_attn, backend))
    if f3 and _select(rows, model="efficient") and _select(rows, model="standard"):
        out.append(_pba_figure3(plt, rows, f3, backend))
    sel4 = _select(rows, heads=f4["heads"]) if f4 else []
    if f4 and len({r["seq_len"] for r in sel4}) > 1 and len({r["d_model"] for r in sel4}) > 1:  # a surface needs a 2-D grid
        out.append(_pba_figure4(plt, sel4, f4, variants, backend))
    return out


def _pba_figure2(plt, rows, f2, variants, c_attn, backend) -> Path:
    sel = _select(rows, seq_len=f2["seq_len"], heads=f2["heads"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in variants:
        pts = sorted((int(r["d_model"]), r["flops_train_step"], r["eqn24"]) for r in sel if r["model"] == v)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"{v} (C={c_attn[v]})")
    axes[0].set_title(f"counted (FlopCounterMode, sdpa={backend})")
    axes[1].set_title("papers/002 Eqn. (24): C_Attn l d_m + 15 h l^2")
    for ax in axes:
        ax.set_xlabel("projection dimension d_m")
        ax.set_ylabel("FLOPs, forward + backward")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Figure 2: one attention layer, l={f2['seq_len']}, h={f2['heads']}, batch 1", fontsize=10)
    fig.tight_layout()
    return _save(fig, f2["path"], plt)


def _pba_figure3(plt, rows, f3, backend) -> Path:
    heads = sorted({int(r["heads"]) for r in rows})
    fig, axes = plt.subplots(2, len(heads), figsize=(3.6 * len(heads) + 1.5, 7.5), squeeze=False,
                             layout="constrained")
    for j, h in enumerate(heads):
        sel = _select(rows, heads=h, model="efficient")
        ds = sorted({int(r["d_model"]) for r in sel})
        ns = sorted({int(r["seq_len"]) for r in sel})
        for i, (key, name) in enumerate((("ratio_standard_measured", "counted"), ("ratio_standard_eqn24", "Eqn. (24)"))):
            grid = [[next((float(r[key]) for r in sel if int(r["d_model"]) == d and int(r["seq_len"]) == n), float("nan"))
                     for d in ds] for n in ns]
            ax = axes[i][j]
            im = ax.imshow(grid, origin="lower", cmap="magma", vmin=1.0, vmax=2.0, aspect="auto")
            for a, row in enumerate(grid):
                for b, v in enumerate(row):
                    ax.text(b, a, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if v < 1.6 else "black")
            mean = sum(v for row in grid for v in row) / max(sum(len(row) for row in grid), 1)
            ax.set_title(f"{name}, h={h}: mean {mean:.2f}", fontsize=9)
            ax.set_xticks(range(len(ds)), [str(d) for d in ds], fontsize=7)
            ax.set_yticks(range(len(ns)), [str(n) for n in ns], fontsize=7)
            if i == 1:
                ax.set_xlabel("d_m", fontsize=8)
            if j == 0:
                ax.set_ylabel("sequence length l", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="FLOPs standard / efficient")
    fig.suptitle(f"Figure 3: FLOPs of standard / efficient attention, one forward + backward pass "
                 f"(top: counted, sdpa={backend}; bottom: Eqn. (24))", fontsize=10)
    return _save(fig, f3["path"], plt)


def _pba_figure4(plt, sel4, f4, variants, backend) -> Path:
    import numpy as np

    ls4, ds4 = sorted({int(r["seq_len"]) for r in sel4}), sorted({int(r["d_model"]) for r in sel4})
    fig = plt.figure(figsize=(4 * len(variants), 7.5))
    x, y = np.meshgrid(np.log2(ls4), np.log2(ds4), indexing="ij")
    for i, (key, name) in enumerate((("flops_train_step", "counted"), ("eqn24", "Eqn. (24)"))):
        for j, v in enumerate(variants):
            value = {(int(r["seq_len"]), int(r["d_model"])): float(r[key]) for r in sel4 if r["model"] == v}
            z = np.array([[np.log10(value.get((n, d), np.nan)) for d in ds4] for n in ls4])
            ax = fig.add_subplot(2, len(variants), i * len(variants) + j + 1, projection="3d")
            ax.plot_surface(x, y, z, cmap="viridis", linewidth=0.2, edgecolor="k")
            ax.set_title(f"{v}: {name}", fontsize=9)
            ax.set_xlabel("log2 l", fontsize=7)
            ax.set_ylabel("log2 d_m", fontsize=7)
            ax.set_zlabel("log10 FLOPs", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(f"Figure 4: FLOPs of a forward + backward pass, h={f4['heads']} "
                 f"(top: counted, sdpa={backend}; bottom: Eqn. (24))", fontsize=10)
    fig.tight_layout()
    return _save(fig, f4["path"], plt)


def save_figure(fig, path, **options) -> None:
    """``fig.savefig(path)`` written atomically (the format from the file's suffix)."""
    from bench_cli.core.files import atomic_open

    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", **options)


def _save(fig, path, plt) -> Path:
    path = Path(str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the attention zoo
@dataclass
class ZooPoint:
    label: str
    metric: float
    train_time_s: float | None
    peak_mem_bytes: float | None
    train_time_sd: float | None = None  # std over seeds: a horizontal error bar


def zoo_figure(points: list[ZooPoint], path: str | Path, title: str, metric: str) -> Path:
    """The metric against the training time (log axis), one labelled point per attention, its area
    proportional to the peak training memory (the LRA paper's Figure 3 form)."""
    plt = _pyplot()
    points = [p for p in points if p.train_time_s]
    mems = [p.peak_mem_bytes for p in points if p.peak_mem_bytes]
    largest = max(mems, default=1.0)
    fig, ax = plt.subplots(figsize=(8, 6))
    colors = plt.get_cmap("tab20")
    for i, p in enumerate(points):
        area = 40 + 900 * (p.peak_mem_bytes or 0) / largest
        ax.scatter([p.train_time_s], [p.metric], s=area, alpha=0.55, color=colors(i % 20), edgecolors="black",
                   linewidths=0.5)
        if p.train_time_sd:  # clipped at a tenth of the time: the axis is logarithmic
            low = min(p.train_time_sd, 0.9 * p.train_time_s)
            ax.errorbar([p.train_time_s], [p.metric], xerr=[[low], [p.train_time_sd]], fmt="none",
                        ecolor=colors(i % 20), elinewidth=1, capsize=3)
    ax.set_xscale("log")
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):  # 2, 3, 4 s, not 2 x 10^0
        axis(ScalarFormatter())
    ax.set_xlabel("training time per run (s, mean ± std over seeds; log scale)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.set_title(f"{title}\npoint area: peak training memory (largest {largest / 2**20:.1f} MiB)", fontsize=10)
    fig.tight_layout()
    _label_points(fig, ax, [(p.label, p.train_time_s, p.metric) for p in points])
    return _save(fig, path, plt)


def _label_points(fig, ax, points: list[tuple[str, float, float]]) -> None:
    """Label each point where its text overlaps no label placed before it and stays inside the axes:
    beside the point if free, else the nearest free slot above or below (either side), joined to its
    point by a thin line. The
    zoo's attentions cluster (thirty points, many within a few percent and seconds), and labels
    drawn on top of each other are unreadable."""
    renderer = fig.canvas.get_renderer()
    placed = []
    slots = [(side * 6, step * 8) for k in range(12) for step in dict.fromkeys((-k, k)) for side in (1, -1)]
    for label, x, y in sorted(points, key=lambda p: -p[2]):
        for dx, dy in slots:
            text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                               va="center", ha="left" if dx > 0 else "right")
            box = text.get_window_extent(renderer).expanded(1.05, 1.15)
            inside = ax.bbox.contains(box.x0, box.y0) and ax.bbox.contains(box.x1, box.y1)
            if inside and not any(box.overlaps(other) for other in placed) or (dx, dy) == slots[-1]:
                break
            text.remove()
        if dy:
            text.remove()
            text = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                               va="center", ha="left" if dx > 0 else "right",
                               arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.45", "shrinkA": 0, "shrinkB": 2})
        placed.append(box)
