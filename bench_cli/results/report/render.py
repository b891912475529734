"""How a report looks: the table cells, the Markdown, the CSV and the terminal table. Numbers are
formatted by bench_cli.core.ui (mean_pm, fixed, signed, csv_value)."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

from bench_cli.results.report.spec import EFFICIENCY, TIMED_COLUMNS
from bench_cli.results.report.stats import ALPHA
from bench_cli.core.ui import DASH, csv_value, fixed, mean_pm, signed

# The width of a report printed to a pipe or a file with COLUMNS unset (and no --width): the
# conventional terminal width, rich's and shutil.get_terminal_size's own fallback, so a log reads
# unwrapped in a pager, a mail or a diff; a wider table prints one block per row.
DEFAULT_WIDTH = 80
# Three questions kept apart (stats.py): is the mean inside the paper's interval (mean ± the
# tolerance), does Welch's test show a difference, and does TOST show equivalence within that margin.
HEADERS = ["dataset", "model", "n", "reproduced", "paper", "Δ", "paper's interval ±max(2σ, 1)",
           "Welch vs paper", "equivalent ±max(2σ, 1) (TOST)"]
# Beside them when the report compares the runs with the committed reproduction (results/reproduced).
COMMITTED_HEADERS = ["committed", "Welch vs committed"]
COMMITTED_CSV = ["committed_n", "committed_mean", "committed_std", "committed_welch_p", "matches_committed"]
CSV_COLUMNS = ["dataset", "model", "paper_model", "n", "n_failed", "seeds", "epochs", "mean", "std", "paper_mean",
               "paper_std", "paper_table", "diff", "tolerance", "within_tolerance", "welch_t", "welch_p",
               "within_spread", "tost_p", "equivalent"]


def headers(floor: float = 1.0, columns=EFFICIENCY, committed: bool = False) -> list[str]:
    """The table's headers: the comparison, the committed reproduction's (``committed``: the runs
    shown are then "yours"), then one per spec column (``label (paper)`` when it has paper values)."""
    shown = [h.replace("max(2σ, 1)", f"max(2σ, {floor:g})") for h in HEADERS]
    if committed:
        shown = [("yours" if h == "reproduced" else h) for h in shown] + COMMITTED_HEADERS
    return shown + [c.header for c in columns]


def _welch_cell(p) -> str:
    """Welch's verdict: a difference, or none shown (absence of evidence, not a match)."""
    return DASH if p is None else f"differs (p={p:.2f})" if p < ALPHA else f"no evidence of a difference (p={p:.2f})"


def _tost_cell(p) -> str:
    """The equivalence test's verdict: the one cell that may say "matches"."""
    return DASH if p is None else f"matches (p={p:.2f})" if p < ALPHA else f"not shown (p={p:.2f})"


def _interval_cell(within: bool | None) -> str:
    return DASH if within is None else "within" if within else "OUTSIDE"


def _committed_cells(r: dict) -> list[str]:
    n = r.get("committed_n") or 0
    return [mean_pm(r.get("committed_mean"), r.get("committed_std")) + (f" (n {n})" if n else ""),
            _welch_cell(r.get("committed_welch_p"))]


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
        within = _interval_cell(None if diff is None else abs(diff) <= a["tolerance"])
        out.append([f"Average ({len(avg['datasets'])} sets)", m, str(a["n"]), mean_pm(a["mean"], a["std"]),
                    mean_pm(a["paper_mean"], a["paper_std"]) + (" [same sets]" if a["paper_mean"] is not None else ""),
                    signed(diff), within, DASH, DASH, *([DASH, DASH] if committed else []), *("" for _ in columns)])
    return out


def display_rows(rows: list[dict], avg: dict | None, labels: list[str], columns=EFFICIENCY,
                 committed: bool = False) -> list[list[str]]:
    """Table cells: one line per row, then the average rows (their spec columns left empty)."""
    out = []
    for r in rows:
        n = str(r["n"]) + (f" ({r['n_failed']} failed)" if r["n_failed"] else "")
        paper = mean_pm(r["paper_mean"], r["paper_std"]) + (f" [T{r['paper_table']}]" if r["paper_table"] else "")
        out.append([r["dataset"], r["model"], n, mean_pm(r["mean"], r["std"]), paper, signed(r.get("diff")),
                    _interval_cell(r.get("within_tolerance")), _welch_cell(r.get("welch_p")), _tost_cell(r.get("tost_p")),
                    *(_committed_cells(r) if committed else []), *(column_cell(r, c) for c in columns)])
    return out + _average_rows(avg, labels, columns, committed)


def markdown_text(text: str) -> str:
    """A line of a Markdown report as text, whatever the names in it hold: a line break (which
    would end the line, the list item or the table row) becomes a space, and ``<`` an entity (raw
    HTML, ``<script>`` or ``<img onerror=...>``, or an autolink ``<javascript:...>``, is passed through
    by Markdown renderers)."""
    return " ".join(str(text).splitlines()).replace("<", "&lt;")


def markdown_cell(text: str) -> str:
    """A Markdown (GFM) table cell as text: ``markdown_text``, then the backslash, the pipe (which
    would split the cell), the backtick (a code span) and a link's ``](`` escaped (CommonMark: a
    backslash before ASCII punctuation is that character)."""
    shown = markdown_text(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
    return shown.replace("](", "\\](").replace("]:", "\\]:").replace("][", "\\][")


def markdown_table(table: list[list[str]], cols: list[str]) -> list[str]:
    return (["| " + " | ".join(map(markdown_cell, cols)) + " |", "|" + "|".join("---" for _ in cols) + "|"]
            + ["| " + " | ".join(map(markdown_cell, row)) + " |" for row in table])


def markdown(title: str, header_lines: list[str], table: list[list[str]], notes: list[str], cols: list[str],
             sections: list[tuple[str, list[list[str]], list[str]]] = ()) -> str:
    """The report; ``sections`` are further (subtitle, table, headers): the columns' own tables."""
    lines = [f"# {markdown_text(title)}", "", *[f"- {markdown_text(h)}" for h in header_lines], "",
             *markdown_table(table, cols)]
    if notes:
        lines += ["", *map(markdown_text, notes)]
    for subtitle, rows, section_cols in sections:
        lines += ["", f"## {markdown_text(subtitle)}", "", *markdown_table(rows, section_cols)]
    return "\n".join(lines) + "\n"


# Every character TeX gives a meaning in text (its category codes other than letters and others,
# plus the three the OT1 font encoding shows as other glyphs), as the text commands that print
# it: a name such as ``\input /etc/passwd`` or ``^^5c`` must print, never run.
LATEX_SPECIALS = {**{c: "\\" + c for c in "&%$#_{}"}, "\\": r"\textbackslash{}", "^": r"\textasciicircum{}",
                  "~": r"\textasciitilde{}", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}


def latex_escape(text: str) -> str:
    """``text`` as LaTeX that prints it: every special character escaped (one at a time, so an
    escape's own backslash and braces are not escaped again), line breaks and other control
    characters as spaces (a blank line inside a cell ends the paragraph: an error), ± as math."""
    shown = "".join(LATEX_SPECIALS.get(c, " " if c < " " or c == "\x7f" else c) for c in str(text))
    return shown.replace("±", r"$\pm$")


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
