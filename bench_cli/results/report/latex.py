"""The table for a paper (``report --format latex``): booktabs, the papers' display names, the
paper's number beside ours per dataset, bold only where a test says the best differs, a caption
that states what the table holds and a ``\\label``.

Rows are models (their display names: ``report.display_names`` of the experiment, else the papers'
names below, else the name itself), columns are datasets, each a pair "Paper | Ours" (mean ± std;
the paper's std where it printed one), then the average over the datasets every model has. In a
column the best of our means is bold only when Welch's t-test over seeds separates it from the
second best (p < ALPHA), and the caption says so: a best within noise is not marked.
"""
from __future__ import annotations

import re

from bench_cli.core.ui import mean_pm
from bench_cli.results.report.render import latex_escape
from bench_cli.results.report.stats import ALPHA, welch

# The papers' names of the models (primal-dual: Softmax, Attention-BN/SH/BN+SH; Primal-Attention:
# Trans., PrimalFormer, Primal.+ and its baselines; pay-better-attention: Standard, Optimised,
# Efficient, Super Attention). Our names are the config's (conf/model/*.yaml).
DISPLAY_NAMES = {
    "softmax": "Softmax", "transformer": "Transformer",
    "attention_bn": "Attention-BN", "attention_sh": "Attention-SH", "attention_bn_sh": "Attention-BN+SH",
    "linear": "Linear", "linear_bn": "Linear-BN", "linear_sh": "Linear-SH", "linear_bn_sh": "Linear-BN+SH",
    "sparse": "Sparse", "sparse_bn": "Sparse-BN", "sparse_sh": "Sparse-SH", "sparse_bn_sh": "Sparse-BN+SH",
    "reformer": "Reformer", "longformer": "Longformer", "performer": "Performer", "linformer": "Linformer",
    "nystromformer": "Nyströmformer", "yoso_e": "YOSO-E", "cosformer": "cosFormer", "soft": "SOFT",
    "flowformer": "Flowformer", "primalformer": "PrimalFormer", "primal_plus": "Primal.+", "primal": "Primal",
    "standard": "Standard", "optimised": "Optimised", "efficient": "Efficient", "super": "Super Attention",
}
SETS = re.compile(r"\s*\(\d+ (?:data)?sets\)")  # "(10 sets)" in a title: the table says its own count


def display_name(model: str, names: dict | None = None) -> str:
    names = dict(names or {})
    return str(names.get(model) or DISPLAY_NAMES.get(model) or model)


def label(name: str) -> str:
    """``tab:<name>``, with what LaTeX labels should not hold replaced."""
    return "tab:" + re.sub(r"[^A-Za-z0-9_:.-]+", "-", name).strip("-")


def caption(title: str, metric: str, datasets: list[str], seeds: int, has_paper: bool, average: bool) -> str:
    """What the table holds: the title without a count of sets that may not be this table's, the
    datasets and seeds, what ± is and what bold means (the test named)."""
    what = f"{len(datasets)} dataset" + ("s" if len(datasets) != 1 else "")
    parts = [f"{SETS.sub('', title).rstrip('. ')} ({what}).",
             f"{metric[:1].upper()}{metric[1:]}: mean ± sample std over {seeds} seed{'s' if seeds != 1 else ''}"
             + (", beside the paper's printed value." if has_paper else " (no paper numbers for these records)."),
             f"Bold: the best of our means in a column where Welch's t-test over seeds separates it from the "
             f"second best (p under {ALPHA:g}); no bold where it does not."]
    if average:
        parts.append("Average: over the datasets every model has.")
    return " ".join(parts)


def _cell(mean, std, bold: bool = False) -> str:
    if mean is None:
        return "--"
    shown = mean_pm(mean, std).replace(" ± ", r" \pm ")
    return f"$\\mathbf{{{shown}}}$" if bold else f"${shown}$"


def significant_best(stats_of: dict, higher_is_better: bool | None):
    """The label whose mean is best and differs from the second best (Welch p < ALPHA), else None.
    ``stats_of``: label -> (mean, std, n)."""
    ranked = sorted(((m, s, n, lab) for lab, (m, s, n) in stats_of.items() if m is not None),
                    key=lambda x: x[0], reverse=bool(higher_is_better))
    if higher_is_better is None or len(ranked) < 2:
        return None
    (m1, s1, n1, best), (m2, s2, n2, _) = ranked[0], ranked[1]
    p = welch(m1, s1, n1, m2, s2, n2)[1]
    return best if p is not None and p < ALPHA and m1 != m2 else None


def table(*, title: str, name: str, metric: str, datasets: list[str], labels: list[str], cells: dict,
          paper_of, avg: dict | None, higher_is_better: bool | None, display: dict | None = None) -> str:
    """The booktabs table. ``cells``: (dataset, label) -> select.Cell; ``paper_of(dataset, label)``:
    a PaperValue or None; ``avg``: stats.average_row's; ``display``: label -> the paper's name."""
    columns = []  # (heading, {label: (paper mean, paper std)}, {label: (mean, std, n)})
    for d in datasets:
        ours = {m: (c.mean, c.std, c.n) if (c := cells.get((d, m))) and c.n else (None, None, 0) for m in labels}
        paper = {m: (p.mean, p.std) if (p := paper_of(d, m)) else (None, None) for m in labels}
        columns.append((latex_escape(d), paper, ours))
    if avg:
        models = avg["models"]
        columns.append(("Average", {m: (models[m]["paper_mean"], models[m]["paper_std"]) for m in labels},
                        {m: (models[m]["mean"], models[m]["std"], models[m]["n"]) for m in labels}))
    bold = [significant_best(ours, higher_is_better) for _, _, ours in columns]
    rows = [" & ".join([latex_escape(display_name(m, display)),
                        *(cell for (_, paper, ours), best in zip(columns, bold)
                          for cell in (_cell(*paper[m]), _cell(ours[m][0], ours[m][1], m == best)))]) + r" \\"
            for m in labels]
    seeds = len({s for c in cells.values() for s in c.values})
    has_paper = any(v[0] is not None for _, paper, _ in columns for v in paper.values())
    rules = " ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(columns)))
    return "\n".join([
        "% needs \\usepackage{booktabs}",
        r"\begin{table}[t]", r"\centering",
        f"\\caption{{{latex_escape(caption(title, metric, datasets, seeds, has_paper, bool(avg)))}}}",
        f"\\label{{{label(name)}}}",
        r"\begin{tabular}{l" + "cc" * len(columns) + "}", r"\toprule",
        " & ".join(["", *(f"\\multicolumn{{2}}{{c}}{{{heading}}}" for heading, _, _ in columns)]) + r" \\",
        rules,
        " & ".join(["Model", *("Paper & Ours" for _ in columns)]) + r" \\", r"\midrule", *rows, r"\bottomrule",
        r"\end{tabular}", r"\end{table}"]) + "\n"
