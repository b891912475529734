"""A paper's efficiency table next to `attnbench profile`'s measurements, as ratios to the baseline.

Absolute seconds and bytes of a 2021-22 GPU and of this machine do not compare; the ratio of a
model to the baseline measured on the same machine does. ``profile.paper`` names a table of a
``results/paper/*.csv`` file (columns table, dataset, model, metric, value) and how its names map
to ours::

    paper:
      csv: results/paper/primal_attention_main.csv
      table: "4"
      baseline: transformer                 # the paper's name of profile's baseline
      models: {linformer: linformer, ...}   # our model preset -> the paper's model
      datasets: {lra_listops: ListOps, ...} # our task -> the paper's dataset
      metrics: {time_per_1k_steps_s: train_time_s_per_1k_steps, peak_mem_train_bytes: train_peak_memory_gb}
      source: "..."                         # cited in the paper_source column

Every profile row then gets ``paper_ratio_<metric>`` = paper value of the model / paper value of
the baseline on the row's task (computed from the printed absolute values, so less rounded than
the printed "(2.8x)" factors), next to our ``ratio_<metric>``. :func:`markdown` renders the rows
of a multi-task profile (``profile.tasks``) as one table per task.
"""
from __future__ import annotations

import csv
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.commands.profile.render import kernel_lines
from bench_cli.core.errors import UserError

# Measurements a paper's efficiency table quotes (the profile's METRICS names).
PAPER_RATIO_METRICS = ("time_per_1k_steps_s", "time_train_s", "peak_mem_train_bytes", "peak_mem_infer_bytes")
PAPER_RATIO_COLUMNS = [f"paper_ratio_{m}" for m in PAPER_RATIO_METRICS]
SPEC_KEYS = ("csv", "table", "baseline", "models", "datasets", "metrics", "source")


def validate(spec: DictConfig | None) -> None:
    """One-line UserErrors for a bad ``profile.paper`` (null: no paper table)."""
    if spec is None:
        return
    for key in spec:
        if key not in SPEC_KEYS:
            raise UserError(f"unknown key profile.paper.{key}; valid: {', '.join(SPEC_KEYS)}")
    for key in ("csv", "table", "baseline", "models", "datasets", "metrics"):
        if spec.get(key) in (None, ""):
            raise UserError(f"profile.paper.{key} is missing (see bench_cli/commands/profile/paper_table.py)")
    for m in spec.metrics:
        if m not in PAPER_RATIO_METRICS:
            raise UserError(f"profile.paper.metrics: '{m}' is not one of {', '.join(PAPER_RATIO_METRICS)}")
    if not Path(str(spec.csv)).is_file():
        raise UserError(f"profile.paper.csv: {spec.csv} not found (run from the repository root, or set the path)")


class PaperRatios:
    """The paper columns of a profile row (none without ``profile.paper``)."""

    def __init__(self, spec: dict | None, values: dict[tuple[str, str, str], float]):
        self.spec, self.values = spec, values

    @classmethod
    def of(cls, spec: DictConfig | None) -> PaperRatios:
        if spec is None:
            return cls(None, {})
        spec = OmegaConf.to_container(spec, resolve=True)
        with open(spec["csv"], newline="") as f:
            values = {(r["dataset"], r["model"], r["metric"]): float(r["value"]) for r in csv.DictReader(f)
                      if r["table"] == str(spec["table"]) and r["value"] not in ("", None)}
        return cls(spec, values)

    def ratio(self, task: str, model: str, metric: str) -> float | None:
        """Paper value of ``model`` over the baseline's, on our ``task``, for our ``metric``."""
        s = self.spec
        dataset, paper_metric = s["datasets"].get(task), s["metrics"].get(metric)
        mine = self.values.get((dataset, s["models"].get(model), paper_metric))
        base = self.values.get((dataset, s["baseline"], paper_metric))
        return None if mine is None or not base else mine / base

    def columns(self, row: dict) -> dict:
        if self.spec is None:
            return {}
        out = {f"paper_ratio_{m}": self.ratio(row["task"], row["model"], m) for m in self.spec["metrics"]}
        if any(v is not None for v in out.values()) and self.spec.get("source"):
            out["paper_source"] = self.spec["source"]
        return out


def _ratio_of(row: dict, side: str, to: str, metric: str) -> float | None:
    """``row``'s ``side`` measurement over its ``to`` measurement (the baseline against the fused one)."""
    a, b = _num(row.get(f"{side}_{metric}")), _num(row.get(f"{to}_{metric}"))
    return None if a is None or not b else a / b


def _num(v) -> float | None:
    return None if v in (None, "") else float(v)


def _ratio_cell(v) -> str:
    """'0.36 (2.8x)': the ratio model / baseline and the paper's way of printing it (baseline / model)."""
    v = _num(v)
    if v is None:
        return "-"
    return f"{v:.2f} ({1 / v:.1f}x)" if v > 0 else f"{v:.2f}"


def _iqr(row: dict, key: str) -> str:
    """' [0.31-0.40]': the IQR of the rounds' ratios, when the row has it."""
    q1, q3 = _num(row.get(f"{key}_q1")), _num(row.get(f"{key}_q3"))
    return "" if q1 is None or q3 is None else f" [{q1:.2f}-{q3:.2f}]"


def _mb(v) -> str:
    v = _num(v)
    return "-" if v is None else f"{v / 2**20:,.1f}"


def _seconds(v) -> str:
    v = _num(v)
    return "-" if v is None else f"{v:,.1f}"


def markdown(rows: list[dict], paper: DictConfig, title: str, notes: str = "") -> str:
    """One table per task: the baseline first (ratios 1), then every model, our time per 1K steps
    and peak training memory with their ratios to the baseline next to the paper's."""
    baseline = str(paper.baseline)
    lines = [f"# {title}", ""]
    if notes:
        lines += [notes.strip(), ""]
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    for task, task_rows in by_task.items():
        first = task_rows[0]
        fused = bool(first.get("fused_baseline"))
        head = ("| model | s / 1K steps | time ratio | paper time ratio | peak train memory (MB) | memory ratio "
                "| paper memory ratio |" + (" time vs fused | memory vs fused |" if fused else "") + " status |")
        lines += [f"## {paper.datasets.get(task, task)} (`{task}`): N = {first['seq_len']}, batch {first['batch_size']}, "
                  f"sdpa {first['sdpa_backend']}, precision {first.get('precision') or '32'}", "",
                  f"Regime: {first.get('regime') or '-'}.", "", f"Timing: {first.get('timing_method') or '-'}.", "",
                  head, "|" + "---|" * (10 if fused else 8)]
        fused_cells = (f"| {_ratio_cell(_ratio_of(first, 'baseline', 'fused', 'time_per_1k_steps_s'))} "
                       f"| {_ratio_cell(_ratio_of(first, 'baseline', 'fused', 'peak_mem_train_bytes'))} ") if fused else ""
        lines.append(f"| {first['baseline']} (baseline, paper: {baseline}) | {_seconds(first.get('baseline_time_per_1k_steps_s'))} "
                     f"| 1.00 | 1.00 | {_mb(first.get('baseline_peak_mem_train_bytes'))} | 1.00 | 1.00 "
                     f"{fused_cells}| {first.get('baseline_status') or '-'} |")
        for r in task_rows:
            status = (r.get("model_status") or r["status"]) + (" **noisy**" if r.get("timing_noisy") else "")
            fused_cells = (f"| {_ratio_cell(r.get('ratio_fused_time_per_1k_steps_s'))}"
                           f"{_iqr(r, 'ratio_fused_time_per_1k_steps_s')} "
                           f"| {_ratio_cell(r.get('ratio_fused_peak_mem_train_bytes'))} ") if fused else ""
            lines.append(f"| {r['model']} | {_seconds(r.get('model_time_per_1k_steps_s'))} "
                         f"| {_ratio_cell(r.get('ratio_time_per_1k_steps_s'))}{_iqr(r, 'ratio_time_per_1k_steps_s')} "
                         f"| {_ratio_cell(r.get('paper_ratio_time_per_1k_steps_s'))} "
                         f"| {_mb(r.get('model_peak_mem_train_bytes'))} | {_ratio_cell(r.get('ratio_peak_mem_train_bytes'))} "
                         f"| {_ratio_cell(r.get('paper_ratio_peak_mem_train_bytes'))} {fused_cells}| {status} |")
        if fused:
            lines += ["", f"Fused baseline ({first['fused_baseline']} through torch's fused scaled_dot_product_attention, "
                          f"today's softmax): {_seconds(first.get('fused_time_per_1k_steps_s'))} s / 1K steps, "
                          f"{_mb(first.get('fused_peak_mem_train_bytes'))} MB peak train memory, "
                          f"{first.get('fused_status') or '-'}."]
        kernels = kernel_lines(task_rows)
        lines += ["", *kernels] if kernels else []
        lines.append("")
    methods: dict[str, list[str]] = {}
    for r in rows:
        models = methods.setdefault(r.get("memory_method") or "-", [])
        models += [] if r["model"] in models else [r["model"]]
    first = rows[0] if rows else {}
    lines += [f"Measured on {first.get('device', '-')}, torch {first.get('torch_version', '-')}, commit "
              f"{first.get('git_commit', '-')}. Memory: " + "; ".join(f"{m} ({', '.join(models)})" for m, models in methods.items())
              + ". Ratios are model / baseline, (Nx) = baseline / model as the paper prints them; a time ratio is "
              "the median of the timing rounds' ratios, [its IQR] after it.", ""]
    noisy = [r for r in rows if r.get("timing_noisy")]
    if noisy:
        from bench_cli.core.spread import NOISY_NOTE

        lines += [f"**{NOISY_NOTE}**: the times of {len(noisy)} row(s) marked noisy were taken on a busy machine or "
                  "spread widely (" + "; ".join(sorted({str(r['timing_noisy']) for r in noisy})) + ").", ""]
    return "\n".join(lines)
