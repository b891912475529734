"""The papers' quoted efficiency reductions next to the ones `attnbench profile` measures.

A profile preset lists them in ``profile.reference`` (conf/profile/figure1.yaml: primal-dual
Sec. 4, "almost 25%" fewer FLOPs, 31.9% / 47.3% less memory at D=64, N=4096): each entry names a
point (d_model, seq_len, optionally sdpa_backend), the source sentence and ``reduction_pct`` per
measurement. They become the ``paper_reduction_pct_<measurement>`` and ``paper_source`` columns of
that point's row and a line under the profile's table.
"""
from __future__ import annotations

# Measurements whose reduction (100 * (1 - ratio model / baseline)) the papers quote.
REDUCTIONS = ("flops_forward", "flops_train_step", "peak_mem_train_bytes", "peak_mem_infer_bytes")
PAPER_COLUMNS = [*[f"paper_reduction_pct_{m}" for m in REDUCTIONS], "paper_source"]
_NAMES = (("flops_train_step", "FLOPs train"), ("flops_forward", "FLOPs inference"),
          ("peak_mem_train_bytes", "memory train"), ("peak_mem_infer_bytes", "memory inference"))


def paper_columns(reference: list[dict], d_model: int, seq_len: int, backend: str) -> dict:
    """The paper columns of the point (d_model, seq_len, backend): every matching entry, later
    entries overriding earlier ones."""
    out: dict = {}
    for ref in reference:
        if int(ref.get("d_model", -1)) != d_model or int(ref.get("seq_len", -1)) != seq_len:
            continue
        if ref.get("sdpa_backend") not in (None, backend):
            continue
        for m, v in (ref.get("reduction_pct") or {}).items():
            out[f"paper_reduction_pct_{m}"] = v
        out["paper_source"] = ref.get("source", "")
    return out


def comparison_lines(rows: list[dict], fmt) -> list[str]:
    """'reduction at D=64, N=4096, sdpa=math: FLOPs train 23.9% (paper 25%), ...' for every row
    with a paper number; ``fmt(value, 'num')`` formats the measured percentage."""
    lines = []
    for r in rows:
        if not any(r.get(f"paper_reduction_pct_{m}") not in (None, "") for m in REDUCTIONS):
            continue
        parts = []
        for m, name in _NAMES:
            ours, paper = r.get(f"reduction_pct_{m}"), r.get(f"paper_reduction_pct_{m}")
            if paper not in (None, ""):
                parts.append(f"{name} {fmt(ours, 'num')}{'%' if ours is not None else ''} (paper {paper}%)")
        lines.append(f"reduction at D={r['d_model']}, N={r['seq_len']}, sdpa={r['sdpa_backend']}: " + ", ".join(parts))
    return lines
