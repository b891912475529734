"""The figures attnbench draws (matplotlib, Agg backend). Each is written twice, atomically: a PNG
(reports, screens) and a PDF beside it (vector, TrueType fonts: for a paper). docs/figures.md
lists them.

* :func:`ratio_figure`: the primal-dual paper's efficiency figures (Figures 1-4 of papers/003) for
  any `attnbench profile` grid: ratio model / baseline vs sequence length, one line per (SDPA
  backend, d_model); FLOPs and peak memory (and wall time with its interquartile range, when the
  profile timed the points), training on top and inference below; the paper's numbers as stars.
* :func:`pba_figures`: the "Pay Better Attention" paper's (papers/002) Figures 2-4 from the counted
  FLOPs of one attention layer, each next to the paper's Eqn. (24).
* :func:`zoo_figure`: the attention zoo's per-task scatter (bench_cli/results/report/zoo.py), in the
  form of the LRA paper's Figure 3 (Tay et al. 2021): score against training time, mean ± std over
  the seeds, marker area by memory, each attention numbered and named in a key.

What makes them readable in print: one colour-blind-safe palette (Okabe & Ito) and a distinct
(colour, marker, line style) per series (:func:`series_styles`); series that coincide are drawn
so both show and are said to coincide; labels placed where they overlap nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

VECTOR_SUFFIX = ".pdf"
PNG_DPI = 130
# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision
# deficiency. Most distinct first (the 4th and 5th the lighter kin of the 1st and 2nd: a figure of
# two groups of three pairs its series by hue); yellow, faint on white, last.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#56B4E9", "#E69F00", "#CC79A7", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<")
LINESTYLES = ("-", "--", "-.", ":")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["pdf.fonttype"] = 42  # TrueType in the PDF: journals refuse Type 3 fonts
    import matplotlib.pyplot as plt

    return plt


def _num(v):
    try:
        return None if v in (None, "") else float(v)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Style:
    color: str
    marker: str
    linestyle: str = "-"


def series_styles(n: int) -> list[Style]:
    """``n`` looks, no two alike: a colour each up to len(PALETTE) series; past that the colours
    come round again with another marker (then another line style), so a reader without colour
    still tells every series apart."""
    out = []
    for i in range(n):
        cycle, c = divmod(i, len(PALETTE))
        out.append(Style(PALETTE[c], MARKERS[(c + cycle) % len(MARKERS)],
                         LINESTYLES[(cycle // len(MARKERS)) % len(LINESTYLES)]))
    return out


def same_values(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Two series with the same points (to 1e-9 relative): drawn one over the other."""
    return len(a) == len(b) and all(x == u and math.isclose(y, v, rel_tol=1e-9) for (x, y), (u, v) in zip(a, b))


def vector_path(path: str | Path) -> Path:
    """The vector copy written beside a figure's PNG."""
    return Path(path).with_suffix(VECTOR_SUFFIX)


def save_figure(fig, path, **options) -> None:
    """``fig.savefig(path)`` written atomically (the format from the file's suffix); no creation
    date in a PDF or SVG, so a figure drawn again from the same data is the same file."""
    from bench_cli.core.files import atomic_open

    fmt = Path(path).suffix.lstrip(".") or "png"
    meta = {"CreationDate": None} if fmt == "pdf" else {"Date": None} if fmt == "svg" else {}
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=fmt, metadata=meta, **options)


def _save(fig, path) -> Path:
    """The PNG at ``path`` and its PDF beside it; the figure closed. Returns the PNG's path."""
    import matplotlib.pyplot as plt

    path = Path(str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=PNG_DPI)
    save_figure(fig, vector_path(path))
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- profile: ratios vs N
# (metric, quantity) per column; the rows are the training step and inference.
RATIO_COLUMNS = (
    (("flops_train_step", "flops_forward"), "FLOPs per sample"),
    (("peak_mem_train_bytes", "peak_mem_infer_bytes"), "peak memory"),
)
TIME_COLUMN = (("time_train_s", "time_infer_s"), "wall time (median of rounds)")
PHASES = ("training step (forward + backward)", "inference (forward)")


def _backend_look(index: int, count: int) -> dict:
    """The first SDPA backend filled, thick and solid; the others hollow, larger, thin and dashed on
    top, so a line lying exactly on the first one's still shows (FLOPs do not depend on the backend)."""
    if index == 0:
        return {"linestyle": "-", "linewidth": 2.8 if count > 1 else 1.6, "markersize": 5, "fillstyle": "full",
                "zorder": 2}
    return {"linestyle": LINESTYLES[index % len(LINESTYLES)], "linewidth": 1.1, "markersize": 7 + 2 * index,
            "fillstyle": "none", "markeredgewidth": 1.3, "zorder": 3}


def draw_ratio_figure(rows: list[dict], title: str = "", subtitle: str = ""):
    """The figure of :func:`ratio_figure`, not saved (tests look at it)."""
    plt = _pyplot()
    backends = list(dict.fromkeys(str(r["sdpa_backend"]) for r in rows))
    d_models = sorted({int(r["d_model"]) for r in rows})
    series = [(b, d) for b in backends for d in d_models]
    styles = dict(zip(series, series_styles(len(series))))
    timed = any(_num(r.get("ratio_time_train_s")) is not None or _num(r.get("ratio_time_infer_s")) is not None
                for r in rows)
    columns = RATIO_COLUMNS + ((TIME_COLUMN,) if timed else ())
    fig, axes = plt.subplots(2, len(columns), figsize=(4.3 * len(columns), 7.6), sharex=True, squeeze=False,
                             layout="constrained")
    seq = sorted({int(r["seq_len"]) for r in rows})
    handles: dict[str, object] = {}
    for col, (metrics, quantity) in enumerate(columns):
        for row, (metric, phase) in enumerate(zip(metrics, PHASES)):
            ax = axes[row][col]
            drawn: dict[tuple, list] = {}
            for (backend, d) in series:
                pts = sorted((int(r["seq_len"]), _num(r.get(f"ratio_{metric}")), r) for r in rows
                             if str(r["sdpa_backend"]) == backend and int(r["d_model"]) == d)
                pts = [(n, v, r) for n, v, r in pts if v is not None]
                if not pts:
                    continue
                drawn[(backend, d)] = [(n, v) for n, v, _ in pts]
                name = f"D={d}" + (f", sdpa={backend}" if len(backends) > 1 else "")
                look = {"color": styles[(backend, d)].color, "marker": styles[(backend, d)].marker,
                        **_backend_look(backends.index(backend), len(backends))}
                line, = ax.plot([n for n, _, _ in pts], [v for _, v, _ in pts], label=name, **look)
                handles.setdefault(name, line)
                low = [v - q for _, v, r in pts if (q := _num(r.get(f"ratio_{metric}_q1"))) is not None]
                high = [q - v for _, v, r in pts if (q := _num(r.get(f"ratio_{metric}_q3"))) is not None]
                if len(low) == len(high) == len(pts):  # the rounds' interquartile range
                    ax.errorbar([n for n, _, _ in pts], [v for _, v, _ in pts], yerr=[low, high], fmt="none",
                                ecolor=look["color"], elinewidth=1, capsize=3, zorder=1)
            for r in rows:
                paper = _num(r.get(f"paper_reduction_pct_{metric}"))
                if paper is not None:
                    name = f"paper (D={r['d_model']}, N={r['seq_len']})"
                    star, = ax.plot([int(r["seq_len"])], [1 - paper / 100], marker="*", markersize=14, color="black",
                                    linestyle="none", label=name, zorder=4)
                    handles.setdefault(name, star)
            ax.axhline(1.0, color="0.5", linewidth=0.8, zorder=0)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seq, [str(n) for n in seq])
            ax.minorticks_off()
            ax.grid(alpha=0.3)
            notes = _coincidence_notes(drawn, backends)
            if metric.startswith("time"):
                notes += _time_notes([r for r in rows if _num(r.get(f"ratio_{metric}")) is not None], metric)
            ax.set_title(f"{quantity},\n{phase}" + "".join(f"\n{n}" for n in notes), fontsize=9)
            ax.set_ylabel("ratio model / baseline" if col == 0 else "")
            if row == 1:
                ax.set_xlabel("sequence length N (tokens)")
    if handles:
        _ratio_legend(fig, handles, backends, d_models)
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return fig


def _ratio_legend(fig, handles: dict, backends: list[str], d_models: list[int]) -> None:
    """One backend: a row. Several: a column per backend, D down each, then the paper's stars in
    their own column (columns padded with blank entries: matplotlib fills them evenly otherwise)."""
    from matplotlib.lines import Line2D

    stars = [name for name in handles if name.startswith("paper")]
    if len(backends) == 1:
        names, ncol = list(handles), len(handles)
    else:
        depth = max(len(d_models), len(stars))
        columns = [[n for n in handles if n.endswith(f"sdpa={b}")] for b in backends] + ([stars] if stars else [])
        names = [n for col in columns for n in col + [""] * (depth - len(col))]
        ncol = len(columns)
    blank = Line2D([], [], linestyle="none")
    fig.legend([handles.get(n, blank) for n in names], names, loc="outside lower center", ncol=ncol, fontsize=8,
               frameon=False)


def _coincidence_notes(drawn: dict[tuple, list], backends: list[str]) -> list[str]:
    """'sdpa=auto lies on sdpa=math' when every line of a backend repeats the first backend's (the
    usual case: FLOPs do not depend on it); otherwise each coinciding pair named."""
    notes = []
    first = backends[0] if backends else None
    for backend in backends[1:]:
        pairs = [(d, same_values(pts, drawn.get((first, d), []))) for (b, d), pts in drawn.items() if b == backend]
        if pairs and all(same for _, same in pairs):
            notes.append(f"(sdpa={backend} coincides with sdpa={first})")
        else:
            notes += [f"(D={d} sdpa={backend} coincides with sdpa={first})" for d, same in pairs if same]
    return notes


def _time_notes(rows: list[dict], metric: str) -> list[str]:
    if not rows:
        return []
    with_iqr = all(_num(r.get(f"ratio_{metric}_q1")) is not None for r in rows)
    noisy = sum(1 for r in rows if r.get("timing_noisy"))
    return [("bars: IQR of the rounds' ratios" if with_iqr else "no interval recorded (single round or older CSV)")
            + (f"; {noisy} point(s) flagged noisy" if noisy else "")]


def ratio_figure(rows: list[dict], path: str | Path, title: str = "", subtitle: str = "") -> Path:
    """Ratios model / baseline vs sequence length (log2 axis) -> ``path`` (PNG) and its PDF."""
    return _save(draw_ratio_figure(rows, title, subtitle), path)


# --------------------------------------------------------------------------- papers/002
PBA_PAPER = "Pay Better Attention paper, Hosseini & Hosseini"
PBA_COUNTED = "counted with torch's FlopCounterMode"


def _select(rows, **kw):
    return [r for r in rows if all(str(r[k]) == str(v) for k, v in kw.items())]


def pba_figures(rows: list[dict], figures, c_attn: dict) -> list[Path]:
    """papers/002 Figure 2 (FLOPs vs d_m at fixed l), Figure 3 (heatmaps of standard/efficient
    FLOPs per number of heads) and Figure 4 (FLOPs over (l, d_m), one head), counted next to
    Eqn. (24). ``rows``: pba_flops.csv's (numbers or the CSV's strings)."""
    plt = _pyplot()
    backend = str(figures.get("backend", "auto"))
    rows = _select(rows, sdpa_backend=backend)
    variants = list(dict.fromkeys(r["model"] for r in rows))
    out = []
    f2, f3, f4 = figures.get("figure2"), figures.get("figure3"), figures.get("figure4")
    if f2 and _select(rows, seq_len=f2["seq_len"], heads=f2["heads"]):
        out.append(_save(draw_pba_figure2(rows, f2, variants, c_attn, backend), f2["path"]))
    if f3 and _select(rows, model="efficient") and _select(rows, model="standard"):
        out.append(_save(_pba_figure3(plt, rows, backend), f3["path"]))
    sel4 = _select(rows, heads=f4["heads"]) if f4 else []
    if f4 and len({r["seq_len"] for r in sel4}) > 1 and len({r["d_model"] for r in sel4}) > 1:  # a surface needs a 2-D grid
        out.append(_save(_pba_figure4(plt, sel4, f4, variants, backend), f4["path"]))
    return out


def draw_pba_figure2(rows, f2, variants, c_attn, backend):
    """FLOPs vs d_m, counted (left) and by Eqn. (24) (right), each on its own log axis: the two
    differ ~1000x (Eqn. (24) has no d_m^2 term for the projections), and on a shared linear axis
    one would be flat. A variant lying on another is drawn hollow on top and says so."""
    plt = _pyplot()
    from matplotlib.ticker import NullLocator

    sel = _select(rows, seq_len=f2["seq_len"], heads=f2["heads"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained")
    styles = dict(zip(variants, series_styles(len(variants))))
    for ax, (key, name) in zip(axes, (("flops_train_step", "{v}"), ("eqn24", "{v} (C_Attn={c})"))):
        points = {v: sorted((int(r["d_model"]), float(r[key])) for r in sel if r["model"] == v) for v in variants}
        twins = {v: next((u for u in variants[:i] if same_values(points[v], points[u])), None)
                 for i, v in enumerate(variants)}
        for v in variants:
            twin = twins[v]
            look = {"color": styles[v].color, "marker": styles[v].marker, "linestyle": styles[v].linestyle,
                    "linewidth": 3 if v in twins.values() else 1.5}  # thick under a twin's thin dashes
            if twin:
                look |= {"fillstyle": "none", "markersize": 10, "markeredgewidth": 1.4, "linestyle": "--",
                         "linewidth": 1.1}
            label = name.format(v=v, c=c_attn.get(v, "?")) + (f"; coincides with {twin}" if twin else "")
            ax.plot([p[0] for p in points[v]], [p[1] for p in points[v]], label=label, zorder=3 if twin else 2,
                    **look)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ds = sorted({int(r["d_model"]) for r in sel})
        ax.set_xticks(ds, [str(d) for d in ds])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("projection dimension d_m")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(f"{PBA_COUNTED} (SDPA backend {backend})", fontsize=9)
    axes[0].set_ylabel("FLOPs, one forward + backward pass (log scale)")
    axes[1].set_title("the paper's Eqn. (24): C_Attn·l·d_m + 15·h·l²", fontsize=9)
    axes[1].set_ylabel("Eqn. (24) FLOPs (log scale)")
    fig.suptitle(f"Figure 2 ({PBA_PAPER}): FLOPs of one attention layer vs projection dimension\n"
                 f"sequence length l={f2['seq_len']}, h={f2['heads']} head(s), batch 1; "
                 "separate log axes (the two counts differ ~1000x)", fontsize=10)
    return fig


def _pba_figure3(plt, rows, backend):
    heads = sorted({int(r["heads"]) for r in rows})
    fig, axes = plt.subplots(2, len(heads), figsize=(3.6 * len(heads) + 1.5, 7.8), squeeze=False,
                             layout="constrained")
    for j, h in enumerate(heads):
        sel = _select(rows, heads=h, model="efficient")
        ds = sorted({int(r["d_model"]) for r in sel})
        ns = sorted({int(r["seq_len"]) for r in sel})
        for i, (key, name) in enumerate((("ratio_standard_measured", "counted"), ("ratio_standard_eqn24", "Eqn. (24)"))):
            grid = [[next((float(r[key]) for r in sel if int(r["d_model"]) == d and int(r["seq_len"]) == n), float("nan"))
                     for d in ds] for n in ns]
            ax = axes[i][j]
            im = ax.imshow(grid, origin="lower", cmap="cividis", vmin=1.0, vmax=2.0, aspect="auto")
            for a, row in enumerate(grid):
                for b, v in enumerate(row):
                    ax.text(b, a, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if v < 1.4 else "black")  # legible on cividis' dark and light ends
            mean = sum(v for row in grid for v in row) / max(sum(len(row) for row in grid), 1)
            ax.set_title(f"{name}, h={h}: mean {mean:.2f}", fontsize=9)
            ax.set_xticks(range(len(ds)), [str(d) for d in ds], fontsize=7)
            ax.set_yticks(range(len(ns)), [str(n) for n in ns], fontsize=7)
            if i == 1:
                ax.set_xlabel("projection dimension d_m", fontsize=8)
            if j == 0:
                ax.set_ylabel("sequence length l", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="FLOPs of standard / efficient attention")
    fig.suptitle(f"Figure 3 ({PBA_PAPER}): FLOPs of standard attention / efficient attention, one forward + "
                 f"backward pass\ntop: {PBA_COUNTED} (SDPA backend {backend}); bottom: the paper's Eqn. (24)",
                 fontsize=10)
    return fig


def _pba_figure4(plt, sel4, f4, variants, backend):
    import numpy as np

    ls4, ds4 = sorted({int(r["seq_len"]) for r in sel4}), sorted({int(r["d_model"]) for r in sel4})
    fig = plt.figure(figsize=(4 * len(variants), 8.6))
    x, y = np.meshgrid(np.log2(ls4), np.log2(ds4), indexing="ij")
    for i, (key, name) in enumerate((("flops_train_step", "counted"), ("eqn24", "Eqn. (24)"))):
        surfaces = {}
        for v in variants:
            value = {(int(r["seq_len"]), int(r["d_model"])): float(r[key]) for r in sel4 if r["model"] == v}
            surfaces[v] = np.array([[np.log10(value.get((n, d), np.nan)) for d in ds4] for n in ls4])
        low, high = np.nanmin(list(surfaces.values())), np.nanmax(list(surfaces.values()))
        for j, (v, z) in enumerate(surfaces.items()):  # one z range and colour scale per row: comparable
            ax = fig.add_subplot(2, len(variants), i * len(variants) + j + 1, projection="3d")
            ax.plot_surface(x, y, z, cmap="viridis", vmin=low, vmax=high, linewidth=0.2, edgecolor="k")
            ax.set_zlim(low, high)
            ax.set_box_aspect(None, zoom=0.8)  # room inside the axes for the z label
            ax.set_title(f"{v} attention: {name}", fontsize=9)
            ax.set_xlabel("log2 sequence length l", fontsize=7)
            ax.set_ylabel("log2 d_m", fontsize=7)
            ax.set_zlabel("log10 FLOPs", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(f"Figure 4 ({PBA_PAPER}): FLOPs of one forward + backward pass, h={f4['heads']}\n"
                 f"top: {PBA_COUNTED} (SDPA backend {backend}); bottom: the paper's Eqn. (24)", fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.97, bottom=0.02, top=0.88, wspace=0.08, hspace=0.12)
    return fig


# --------------------------------------------------------------------------- the attention zoo
@dataclass
class ZooPoint:
    label: str
    metric: float
    train_time_s: float | None
    peak_mem_bytes: float | None
    train_time_sd: float | None = None  # std over seeds: a horizontal error bar
    metric_sd: float | None = None      # std over seeds: a vertical error bar


def draw_zoo_figure(points: list[ZooPoint], title: str, metric: str, subtitle: str = ""):
    """The figure of :func:`zoo_figure`, not saved; returns (figure, the number labels)."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    points = [p for p in points if p.train_time_s]
    mems = [p.peak_mem_bytes for p in points if p.peak_mem_bytes]
    largest = max(mems, default=1.0)
    fig, ax = plt.subplots(figsize=(10.5, 6.6), layout="constrained")
    keys, areas = [], []
    for k, (p, style) in enumerate(zip(points, series_styles(len(points))), start=1):
        area = 30 + 420 * (p.peak_mem_bytes or 0) / largest
        areas.append(area)
        ax.scatter([p.train_time_s], [p.metric], s=area, marker=style.marker, color=style.color, alpha=0.8,
                   edgecolors="black", linewidths=0.5, zorder=3)
        xerr = None
        if p.train_time_sd:  # clipped above zero: the axis is logarithmic
            xerr = [[min(p.train_time_sd, 0.9 * p.train_time_s)], [p.train_time_sd]]
        if xerr or p.metric_sd:
            ax.errorbar([p.train_time_s], [p.metric], xerr=xerr, yerr=[p.metric_sd] if p.metric_sd else None,
                        fmt="none", ecolor=style.color, elinewidth=1, capsize=2.5, zorder=2)
        keys.append(Line2D([], [], marker=style.marker, color=style.color, markeredgecolor="black",
                           markeredgewidth=0.5, linestyle="none", markersize=7, label=f"{k:>2}  {p.label}"))
    ax.set_xscale("log")
    # seconds as 2, 3, 5, 10, 20, not 2 x 10^0; only 1, 2, 3 and 5 of each decade, so they never crowd
    seconds = FuncFormatter(lambda v, _: f"{v:g}" if v > 0 and f"{v:e}"[0] in "1235" else "")
    ax.xaxis.set_major_formatter(seconds)
    ax.xaxis.set_minor_formatter(seconds)
    ax.tick_params(axis="x", which="both", labelsize=8)
    ax.set_xlabel("training time per run (s, log scale)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    fig.legend(handles=keys, loc="outside right upper", fontsize=7.5, frameon=False, handletextpad=0.3,
               title="rank: attention", title_fontsize=8, ncol=1 if len(keys) <= 32 else 2)
    fig.suptitle(f"{title}\n{subtitle + '; ' if subtitle else ''}marker area ∝ peak training memory "
                 f"(largest {largest / 2**20:.1f} MiB)", fontsize=10)
    fig.canvas.draw()                # the constrained layout settles the axes; the labels are placed in it
    fig.set_layout_engine("none")    # and it stays put when saved
    labels = _number_points(fig, ax, points, areas)
    return fig, labels


def zoo_figure(points: list[ZooPoint], path: str | Path, title: str, metric: str, subtitle: str = "") -> Path:
    """The metric against the training time (log axis), one numbered marker per attention (the key
    beside the axes names it; the number is its rank in the list given), its area proportional to
    the peak training memory (the LRA paper's Figure 3 form); error bars: std over seeds."""
    fig, _ = draw_zoo_figure(points, title, metric, subtitle)
    return _save(fig, path)


LEADER_STEP = 4  # a number further than this (points) from its marker's edge is joined to it by a line


def _crosses(box, p0, p1) -> bool:
    """Whether the segment p0-p1 passes through ``box`` (Liang-Barsky clipping)."""
    (x0, y0), (x1, y1) = p0, p1
    t0, t1, dx, dy = 0.0, 1.0, x1 - x0, y1 - y0
    for p, q in ((-dx, x0 - box.x0), (dx, box.x1 - x0), (-dy, y0 - box.y0), (dy, box.y1 - y0)):
        if p == 0:
            if q < 0:
                return False
        elif p < 0:
            t0 = max(t0, q / p)
        else:
            t1 = min(t1, q / p)
    return t0 <= t1


def _number_points(fig, ax, points: list[ZooPoint], areas: list[float]) -> list:
    """Number each point (1, 2, ...) at the nearest spot where the number overlaps no other number,
    stays inside the axes and, if it can, covers no marker and no error bar: rings of growing radius
    around the point, 16 directions each; a number not right beside its marker gets a thin leader
    line, which crosses no other number. Thirty attentions cluster within a few percent and
    seconds: names would not fit, numbers do."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72.0                                        # pixels per point
    to_screen = ax.transData.transform
    centres = [to_screen((p.train_time_s, p.metric)) for p in points]
    radii = [math.sqrt(a) / 2 * px for a in areas]             # scatter's s is the marker's area in points^2
    obstacles = [Bbox.from_bounds(cx - r, cy - r, 2 * r, 2 * r) for (cx, cy), r in zip(centres, radii)]
    for p in points:                                           # the error bars, as thin boxes
        if p.train_time_sd:
            (x0, y), (x1, _) = to_screen((p.train_time_s - min(p.train_time_sd, 0.9 * p.train_time_s), p.metric)), \
                to_screen((p.train_time_s + p.train_time_sd, p.metric))
            obstacles.append(Bbox([[x0, y - 1.5 * px], [x1, y + 1.5 * px]]))
        if p.metric_sd:
            (x, y0), (_, y1) = to_screen((p.train_time_s, p.metric - p.metric_sd)), \
                to_screen((p.train_time_s, p.metric + p.metric_sd))
            obstacles.append(Bbox([[x - 1.5 * px, y0], [x + 1.5 * px, y1]]))
    inside = ax.bbox.padded(-2)
    order = (0, 4, 8, 12, 2, 6, 10, 14, 1, 3, 5, 7, 9, 11, 13, 15)  # right, up, left, down, then between
    directions = [(math.cos(math.pi * k / 8), math.sin(math.pi * k / 8)) for k in order]
    steps = (1, 4, 8, 13, 19, 26, 34, 43, 53, 64, 76, 90, 105, 122, 140, 160, 185, 215)
    placed, leaders, labels = [], [], []
    for k, ((cx, cy), own) in enumerate(zip(centres, radii), start=1):
        probe = fig.text(0, 0, str(k), fontsize=7.5, fontweight="bold")
        extent = probe.get_window_extent(renderer)
        probe.remove()
        w, h = extent.width + 2, extent.height + 1
        best = fallback = None
        for step in steps:
            radius = own + px * step
            for dx, dy in directions:
                # the box's nearest edge at ``radius`` from the centre, in that direction
                box = Bbox.from_bounds(cx + dx * (radius + w / 2) - w / 2, cy + dy * (radius + h / 2) - h / 2, w, h)
                if not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)):
                    continue
                fallback = fallback or (box, step)
                leader = ((cx, cy), ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)) if step > LEADER_STEP else None
                if any(box.overlaps(o) for o in placed) or any(_crosses(box, *seg) for seg in leaders) \
                        or (leader and any(_crosses(o, *leader) for o in placed)):
                    continue  # on a number, or a leader line through one: never
                if not any(box.overlaps(o) for o in obstacles):
                    best = (box, step)
                    break
                best = best or (box, step)  # free of numbers, on a marker or bar: kept if nothing better
            if best and not any(best[0].overlaps(o) for o in obstacles):
                break
        box, step = best or fallback  # fallback: every spot within reach taken (never seen)
        placed.append(box)
        centre = ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)
        if step > LEADER_STEP:
            leaders.append(((cx, cy), centre))
        offset = (centre[0] - cx) / px, (centre[1] - cy) / px
        labels.append(ax.annotate(str(k), (points[k - 1].train_time_s, points[k - 1].metric), xytext=offset,
                                  textcoords="offset points", fontsize=7.5, fontweight="bold", ha="center",
                                  va="center", zorder=5,
                                  arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.3", "shrinkA": 1,
                                              "shrinkB": 0} if step > LEADER_STEP else None))
    return labels
