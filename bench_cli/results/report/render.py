"""How a report looks: the table cells, the Markdown, the CSV and the terminal table. Numbers are
formatted by bench_cli.core.ui (mean_pm, fixed, signed, csv_value)."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

from bench_cli.results.report.spec import EFFICIENCY, TIMED_COLUMNS
from bench_cli.core.ui import DASH, csv_value, fixed, mean_pm, signed

# The width of a report printed to a pipe or a file with COLUMNS unset (and no --width): the
# conventional terminal width, rich's and shutil.get_terminal_size's own fallback, so a log reads
# unwrapped in a pager, a mail or a diff; a wider table prints one block per row.
DEFAULT_WIDTH = 80
HEADERS = ["dataset", "model", "n", "reproduced", "paper", "Δ", "within max(2σ, 1)",
           "matches paper (Welch p ≥ 0.05)"]
# Beside them when the report compares the runs with the committed reproduction (results/reproduced).
COMMITTED_HEADERS = ["committed", "matches committed (Welch p ≥ 0.05)"]
COMMITTED_CSV = ["committed_n", "committed_mean", "committed_std", "committed_welch_p", "matches_committed"]
CSV_COLUMNS = ["dataset", "model", "paper_model", "n", "n_failed", "seeds", "epochs", "mean", "std", "paper_mean",
               "paper_std", "paper_table", "diff", "tolerance", "within_tolerance", "welch_t", "welch_p",
               "within_spread"]


def headers(floor: float = 1.0, columns=EFFICIENCY, committed: bool = False) -> list[str]:
    """The table's headers: the comparison, the committed reproduction's (``committed``: the runs
    shown are then "yours"), then one per spec column (``label (paper)`` when it has paper values)."""
    shown = [f"within max(2σ, {floor:g})" if h.startswith("within") else h for h in HEADERS]
    if committed:
        shown = [("yours" if h == "reproduced" else h) for h in shown] + COMMITTED_HEADERS
    return shown + [c.header for c in columns]


def _matches(p, yes: bool | None) -> str:
    return DASH if p is None else f"{'yes' if yes else 'no'} (p={p:.2f})"


def _committed_cells(r: dict) -> list[str]:
    n = r.get("committed_n") or 0
    return [mean_pm(r.get("committed_mean"), r.get("committed_std")) + (f" (n {n})" if n else ""),
            _matches(r.get("committed_welch_p"), r.get("matches_committed"))]


def column_cell(row: dict, column) -> str:
    """The value (± its spread over the runs for a time; 'noisy' when a run behind it was flagged),
    then the paper's in brackets when the column has one."""
    shown = fixed(row.get(column.csv_name), column.digits)
    if row.get(f"{column.csv_name}_sd") is not None and shown != DASH:
        shown += f" ± {fixed(row[f'{column.csv_name}_sd'], column.digits)}"
    if row.get(f"{column.csv_name}_noisy"):
        shown += " noisy"
    return f"{shown} ({fixed(row.get(f'paper_{column.csv_name}'), column.digits)})" if column.paper_metric else shown


def _average_rows(avg: dict | None, labels: list[str], columns, committed: bool = False) -> list[list[str]]:
    out = []
    for m in labels if avg else []:
        a = avg["models"][m]
        diff = None if a["paper_mean"] is None else a["mean"] - a["paper_mean"]
        within = DASH if diff is None else ("yes" if abs(diff) <= a["tolerance"] else "NO")
        out.append([f"Average ({len(avg['datasets'])} sets)", m, str(a["n"]), mean_pm(a["mean"], a["std"]),
                    mean_pm(a["paper_mean"], a["paper_std"]) + (" [same sets]" if a["paper_mean"] is not None else ""),
                    signed(diff), within, DASH, *([DASH, DASH] if committed else []), *("" for _ in columns)])
    return out


def display_rows(rows: list[dict], avg: dict | None, labels: list[str], columns=EFFICIENCY,
                 committed: bool = False) -> list[list[str]]:
    """Table cells: one line per row, then the average rows (their spec columns left empty)."""
    out = []
    for r in rows:
        n = str(r["n"]) + (f" ({r['n_failed']} failed)" if r["n_failed"] else "")
        within = DASH if r.get("within_tolerance") is None else ("yes" if r["within_tolerance"] else "NO")
        spread = _matches(r.get("welch_p"), r.get("within_spread"))
        paper = mean_pm(r["paper_mean"], r["paper_std"]) + (f" [T{r['paper_table']}]" if r["paper_table"] else "")
        out.append([r["dataset"], r["model"], n, mean_pm(r["mean"], r["std"]), paper, signed(r.get("diff")), within,
                    spread, *(_committed_cells(r) if committed else []), *(column_cell(r, c) for c in columns)])
    return out + _average_rows(avg, labels, columns, committed)


def _markdown_table(table: list[list[str]], cols: list[str]) -> list[str]:
    return (["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
            + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table])


def markdown(title: str, header_lines: list[str], table: list[list[str]], notes: list[str], cols: list[str],
             sections: list[tuple[str, list[list[str]], list[str]]] = ()) -> str:
    """The report; ``sections`` are further (subtitle, table, headers): the columns' own tables."""
    lines = [f"# {title}", "", *[f"- {h}" for h in header_lines], "", *_markdown_table(table, cols)]
    if notes:
        lines += ["", *notes]
    for subtitle, rows, section_cols in sections:
        lines += ["", f"## {subtitle}", "", *_markdown_table(rows, section_cols)]
    return "\n".join(lines) + "\n"


LATEX_SPECIALS = {c: "\\" + c for c in "&%$#_{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIALS.get(c, c) for c in str(text)).replace("±", r"$\pm$")


def _latex_cell(mean, std, bold: bool) -> str:
    if mean is None:
        return "--"
    shown = mean_pm(mean, std).replace(" ± ", r" \pm ")
    return f"$\\mathbf{{{shown}}}$" if bold else f"${shown}$"


def latex(caption: str, datasets: list[str], labels: list[str], cells: dict, avg: dict | None,
          higher_is_better: bool | None) -> str:
    """The table for a paper (booktabs): a row per model, a column per dataset (and the average over
    the datasets every model has), mean ± std over seeds, the best of each column in bold (none
    when the metric's direction is unknown)."""
    columns = [(d, {m: cells.get((d, m)) for m in labels}) for d in datasets]
    means = [{m: (c.mean, c.std) if c and c.n else (None, None) for m, c in col.items()} for _, col in columns]
    heads = [latex_escape(d) for d in datasets]
    if avg:
        means.append({m: (avg["models"][m]["mean"], avg["models"][m]["std"]) for m in labels})
        heads.append(f"Average ({len(avg['datasets'])} sets)")
    best = []
    for column in means:
        values = [v for v, _ in column.values() if v is not None]
        best.append(None if higher_is_better is None or not values else (max if higher_is_better else min)(values))
    rows = [" & ".join([latex_escape(m), *(_latex_cell(*column[m], column[m][0] is not None and column[m][0] == b)
                                           for column, b in zip(means, best))]) + r" \\" for m in labels]
    return "\n".join([
        "% needs \\usepackage{booktabs}; mean $\\pm$ sample std over seeds, the best per column in bold",
        r"\begin{table}[t]", r"\centering", f"\\caption{{{latex_escape(caption)}}}",
        r"\begin{tabular}{l" + "c" * len(heads) + "}", r"\toprule",
        " & ".join(["Model", *heads]) + r" \\", r"\midrule", *rows, r"\bottomrule", r"\end{tabular}",
        r"\end{table}"]) + "\n"


def csv_columns(columns=EFFICIENCY, committed: bool = False) -> list[str]:
    """The CSV's columns: the comparison (and the committed reproduction's); the plain means of the
    spec columns without paper values, then their shown values; ours and the paper's of the others."""
    plain = [c for c in columns if not c.paper_metric]
    return (CSV_COLUMNS + (COMMITTED_CSV if committed else []) + [c.column for c in plain] + [c.csv_name for c in plain]
            + [n for c in columns if c.paper_metric for n in (c.csv_name, f"paper_{c.csv_name}")]
            + [f"{c.csv_name}_{k}" for c in columns if c.column in TIMED_COLUMNS for k in ("sd", "noisy")])


def csv_rows(rows: list[dict], avg: dict | None, labels: list[str], columns=EFFICIENCY,
             committed: bool = False) -> list[dict]:
    """The CSV's rows (every value a string), the average rows last."""
    names = csv_columns(columns, committed)
    out = [{k: csv_value(r.get(k)) for k in names} for r in rows]
    for m in labels if avg else []:
        a = avg["models"][m]
        diff = None if a["paper_mean"] is None else a["mean"] - a["paper_mean"]
        values = {"dataset": f"Average ({' '.join(avg['datasets'])})", "model": m, "n": a["n"], "mean": a["mean"],
                  "std": a["std"], "paper_mean": a["paper_mean"], "paper_std": a["paper_std"], "diff": diff,
                  "tolerance": a["tolerance"], "within_tolerance": None if diff is None else abs(diff) <= a["tolerance"]}
        out.append({k: csv_value(values.get(k)) for k in names})
    return out


def write_csv(path: Path, rows: list[dict], avg: dict | None, labels: list[str], columns=EFFICIENCY,
              committed: bool = False) -> None:
    """The table as CSV, through the one atomic CSV writer (bench_cli.results.csv_store.write_rows)."""
    from bench_cli.results.csv_store import write_rows

    write_rows(path, csv_rows(rows, avg, labels, columns, committed), csv_columns(columns, committed), append=False)


def width(console, given: int | None = None) -> int:
    """The report's width: ``--width``, else ``COLUMNS``, else the terminal's, else DEFAULT_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if given:
        return given
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return console.width if console.is_terminal else DEFAULT_WIDTH


def sized(console, given: int | None = None):
    """A console on ``console``'s stream that is ``width(console, given)`` columns wide."""
    from rich.console import Console

    return Console(file=console.file, width=width(console, given))


def wrapped(text: str, columns: int) -> list[str]:
    """``text`` in lines of at most ``columns``, broken at spaces only, so a path, a name or an
    override is never cut (one longer than the width gets a line of its own); continuation lines
    are indented."""
    return textwrap.wrap(text, columns, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False) or [""]


def print_lines(console, lines: list[str]) -> None:
    """Plain lines (no markup), each wrapped to the console's width by ``wrapped``."""
    from rich.markup import escape

    for line in lines:
        for part in wrapped(line, console.width):
            console.print(escape(part), soft_wrap=True)


def print_table(console, title: str, header: list[str], display: list[list[str]], notes: list[str],
                cols: list[str]) -> None:
    """The table within the console's width (``sized``): one line per row when it fits, else one
    block per row instead of squeezed, wrapped cells (ui.show_table); then the header lines and the
    notes, wrapped between words. Rows that miss the tolerance are red."""
    from rich.markup import escape

    from bench_cli.core.ui import show_table

    show_table(escape("\n".join(wrapped(title, console.width))), cols, [[escape(c) for c in row] for row in display],
               row_styles=["red" if "NO" in row[6:7] else None for row in display], out=console)
    print_lines(console, header + notes)
