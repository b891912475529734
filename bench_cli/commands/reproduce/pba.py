"""papers/002, "You Need to Pay Better Attention" (Hosseini & Hosseini): `attnbench profile profile=pba`.

1. The "# Param." columns of Tables 1-3 and 5-10, per attention layer, counted from the built
   standard / optimised / efficient / super layers and compared with the printed value at its
   printed precision (conf/profile/pba.yaml transcribes them; the reference CSV cross-checks the
   transcription).
2. Counted FLOPs of one forward + backward pass of a single attention layer over a (heads, d_model,
   seq_len) grid, next to our analytic count and the paper's Eqn. (24),
   FLOPs = C_Attn * l * d_m + 15 * h * l^2: the data of its Figures 2-4 (bench_cli/results/plots.py).
"""
from __future__ import annotations

import csv
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.core.errors import unknown_choice
from bench_cli.commands.profile.settings import int_list
from bench_cli.commands.profile.harness import profile_layer


# Projections (d_m x d_m, with bias) each variant of papers/002 has; super adds W^A (l x l).
PBA_PROJECTIONS = {"standard": 4, "optimised": 3, "efficient": 2, "super": 2}

PBA_PARAMS_COLUMNS = [
    "table", "dataset", "model", "heads", "d_model", "context_len", "printed", "printed_value", "printed_resolution",
    "ours", "match", "how", "reference_csv_value", "reference_csv_agrees", "note",
]
PBA_FLOPS_COLUMNS = [
    "model", "heads", "d_model", "seq_len", "batch_size", "sdpa_backend", "params", "flops_forward",
    "flops_train_step", "analytic_forward", "analytic_train_step", "eqn24", "c_attn", "ratio_standard_measured",
    "ratio_standard_eqn24", "run_id", "git_commit", "torch_version",
]


def analytic_layer_flops(variant: str, batch: int, seq_len: int, d_model: int, *, train: bool,
                         backend: str = "auto") -> int:
    """Matmul FLOPs of one self-attention layer of papers/002 (or softmax) in our convention.

    P projections of (B*N, d) x (d, d): 2BNd^2 each forward; backward 2 more matmuls each
    (weight grad and input grad: the layer input requires grad as inside a network).
    Scores and AV over all heads: 2BN^2d each forward; backward 5 of them for fused kernels
    (scores recomputed, torch's convention) or 4 for the math path. Super's W^A V: 2BN^2d
    forward, 2 more backward (grads of V and W^A). The number of heads does not enter.
    """
    n_proj = {"softmax": 4, **PBA_PROJECTIONS}[variant]
    proj = 2 * batch * seq_len * d_model * d_model
    mm = 2 * batch * seq_len * seq_len * d_model
    align = mm if variant == "super" else 0
    if not train:
        return n_proj * proj + 2 * mm + align
    sdpa_backward = (4 if backend == "math" else 5) * mm
    return 3 * n_proj * proj + 2 * mm + sdpa_backward + 3 * align


def eqn24_flops(variant: str, seq_len: int, d_model: int, heads: int, c_attn: dict) -> int:
    """papers/002 Eqn. (24): FLOPs of a forward + backward pass = C_Attn * l * d_m + 15 * h * l^2."""
    return int(c_attn[variant]) * seq_len * d_model + int(c_attn.get("head_term", 15)) * heads * seq_len * seq_len


def build_pba_layer(variant: str, d_model: int, heads: int, context_len: int | None):
    from attnbench.models.attention import build_attention

    options = {"max_len": context_len} if variant == "super" else {}
    return build_attention(variant, d_model=d_model, n_heads=heads, **options)


def validate(p: DictConfig) -> None:
    """The pba mode's own keys of ``profile`` (the common ones: bench_cli.commands.profile.config)."""
    int_list(p, "heads")
    for v in p.variants:
        if str(v) not in PBA_PROJECTIONS:
            raise unknown_choice("profile.variants entry", str(v), PBA_PROJECTIONS)


def parse_printed(text: str) -> tuple[int, int]:
    """A parameter count as printed in papers/002 -> (value, resolution): '66K' -> (66000, 1000),
    '2.36M' -> (2360000, 10000), '4,224' -> (4224, 1) (printed in full: exact)."""
    s = str(text).strip().replace(",", "")
    scale = {"K": 10**3, "M": 10**6}.get(s[-1:].upper(), 1)
    number = s[:-1] if scale > 1 else s
    decimals = len(number.split(".")[1]) if "." in number else 0
    resolution = scale // 10**decimals if scale > 1 else 1
    return int(round(float(number) * scale)), max(resolution, 1)


def _compare_printed(ours: int, printed: str) -> tuple[bool, str]:
    value, res = parse_printed(printed)
    if res == 1:
        return ours == value, "exact"
    if (ours // res) * res == value:
        return True, "truncated" if round(ours / res) * res != value else "rounded (= truncated)"
    if round(ours / res) * res == value:
        return True, "rounded"
    return False, f"differs by {ours - value:+d}"


def _read_reference(path: str | None) -> dict | None:
    if not path or not Path(path).is_file():
        return None
    out = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("metric") == "params_per_attention_layer":
                key = (str(r["table"]), r["dataset"], r["model"], int(r["heads"]), int(r["d_model"]))
                out.setdefault(key, set()).add(int(float(r["value"])))
    return out


def pba_params_rows(entries, reference_csv: str | None = None) -> list[dict]:
    """One row per (table row, variant): our count from the built layer vs the printed "# Param."."""
    from bench_cli.engine.counting import attention_parameters

    reference = _read_reference(reference_csv)
    rows = []
    for e in entries:
        e = OmegaConf.to_container(e, resolve=True) if OmegaConf.is_config(e) else dict(e)
        heads, d, ctx = int(e["heads"]), int(e["d_model"]), e.get("context_len")
        per_layer = {v: attention_parameters(build_pba_layer(v, d, heads, ctx))["attn_params_per_layer"]
                     for v in PBA_PROJECTIONS if v in (e.get("printed") or {}) or v in (e.get("total_difference") or {})}
        for variant, printed in (e.get("printed") or {}).items():
            ours = per_layer[variant]
            ok, how = _compare_printed(ours, str(printed))
            value, res = parse_printed(str(printed))
            row = {"table": e["table"], "dataset": e["dataset"], "model": variant, "heads": heads, "d_model": d,
                   "context_len": ctx if variant == "super" else "", "printed": str(printed), "printed_value": value,
                   "printed_resolution": res, "ours": ours, "match": ok, "how": how, "note": e.get("note", "")}
            if reference is not None:
                refs = reference.get((str(e["table"]), e["dataset"], variant, heads, d))
                row["reference_csv_value"] = ",".join(str(v) for v in sorted(refs)) if refs else "missing"
                row["reference_csv_agrees"] = bool(refs) and refs == {value}
            rows.append(row)
        diff = e.get("total_difference")
        if diff:  # e.g. Table 7: total(super) - total(efficient) of two ViTs differing only in W^A
            (a, pa), (b, pb) = list(diff.items())
            va, ra = parse_printed(str(pa))
            vb, rb = parse_printed(str(pb))
            layers = int(e["attention_layers"])
            ours = layers * (per_layer[a] - per_layer[b])
            ok = abs(ours - (va - vb)) < ra + rb
            rows.append({"table": e["table"], "dataset": e["dataset"], "model": f"{a}-{b} (total)", "heads": heads,
                         "d_model": d, "context_len": ctx, "printed": f"{pa} - {pb}", "printed_value": va - vb,
                         "printed_resolution": ra + rb, "ours": ours, "match": ok,
                         "how": f"{layers} layers x (l^2 + l), within the printed precision" if ok else "differs",
                         "note": e.get("note", "")})
    return rows


def reference_coverage(rows: list[dict], reference_csv: str | None) -> str:
    """One line: how the transcribed "# Param." values compare with the reference CSV."""
    reference = _read_reference(reference_csv)
    if reference is None:
        return f"reference CSV {reference_csv} not found: transcription not cross-checked"
    covered = {(str(r["table"]), r["dataset"], r["model"], int(r["heads"]), int(r["d_model"])) for r in rows}
    missing = sorted(set(reference) - covered)
    agree = sum(1 for r in rows if r.get("reference_csv_agrees") is True)
    checked = sum(1 for r in rows if "reference_csv_agrees" in r)
    text = f"reference CSV {reference_csv}: {agree}/{checked} printed values agree"
    return text + (f"; {len(missing)} reference rows not transcribed: {missing[:3]}" if missing else
                   f", all {len(reference)} of its '# Param.' rows covered")


def run_pba(cfg: DictConfig, progress=None, run_id: str | None = None) -> tuple[list[dict], list[dict]]:
    """(params rows, FLOPs rows) for papers/002; see the module docstring."""
    from bench_cli.results.provenance import provenance
    from bench_cli.results.run_folder import new_run_id

    p = cfg.profile
    params = pba_params_rows(p.get("params_tables") or [], p.get("reference_csv"))
    prov = provenance()
    run_id = run_id or new_run_id()
    c_attn = OmegaConf.to_container(p.eqn24, resolve=True)
    variants = [str(v) for v in p.variants]
    seq_lens, d_models, heads = int_list(p, "seq_lens"), int_list(p, "d_models"), int_list(p, "heads")
    batch = int(p.batch_size)
    points = [(b, h, d, n) for b in p.sdpa_backends for h in heads for d in d_models for n in seq_lens if d % h == 0]
    bar = progress.add_task("pba FLOPs", total=len(points), status="") if progress else None
    rows = []
    for backend, h, d, n in points:
        group = []
        for v in variants:
            m = profile_layer(v, batch, n, d, h, meta=str(p.flops) != "real", backend=str(backend))
            group.append({
                "model": v, "heads": h, "d_model": d, "seq_len": n, "batch_size": batch, "sdpa_backend": backend,
                **m,
                "analytic_forward": analytic_layer_flops(v, batch, n, d, train=False, backend=str(backend)),
                "analytic_train_step": analytic_layer_flops(v, batch, n, d, train=True, backend=str(backend)),
                "eqn24": batch * eqn24_flops(v, n, d, h, c_attn), "c_attn": c_attn[v],
                "run_id": run_id, "git_commit": prov["git_commit"], "torch_version": prov["torch_version"],
            })
        ref = next((r for r in group if r["model"] == str(p.get("baseline_variant", "standard"))), None)
        for r in group:
            if ref is not None:
                r["ratio_standard_measured"] = ref["flops_train_step"] / r["flops_train_step"]
                r["ratio_standard_eqn24"] = ref["eqn24"] / r["eqn24"]
        rows += group
        if progress:
            progress.advance(bar)
    return params, rows


def print_pba_tables(params: list[dict], flops: list[dict]) -> None:
    from rich.table import Table

    from bench_cli.commands.profile.render import fmt
    from bench_cli.core.ui import console

    ok = sum(bool(r["match"]) for r in params)
    t = Table(title=f"papers/002 '# Param.' per attention layer: {ok}/{len(params)} match")
    for col in ("table", "dataset", "h", "d_m", "l", "model", "printed", "ours", "match"):
        t.add_column(col)
    for r in params:
        t.add_row(str(r["table"]), r["dataset"], str(r["heads"]), str(r["d_model"]), str(r["context_len"]),
                  r["model"], r["printed"], f"{r['ours']:,}",
                  "[green]yes[/] " + r["how"] if r["match"] else f"[red]no[/] {r['how']}")
    console.print(t)
    if flops:
        t = Table(title="FLOPs of one forward + backward pass of one layer (batch 1, h=1, l=64): counted vs Eqn. (24)")
        for col in ("sdpa", "d_m", "model", "counted", "ours analytic", "Eqn. (24)", "std/x counted", "std/x Eqn. (24)"):
            t.add_column(col)
        for r in flops:
            if r["heads"] == 1 and r["seq_len"] == 64:
                t.add_row(r["sdpa_backend"], str(r["d_model"]), r["model"], fmt(r["flops_train_step"]),
                          fmt(r["analytic_train_step"]), fmt(r["eqn24"]), fmt(r.get("ratio_standard_measured"), "ratio"),
                          fmt(r.get("ratio_standard_eqn24"), "ratio"))
        console.print(t)


