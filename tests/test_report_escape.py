"""Every output another program interprets is escaped for it, tested with every special character
of its syntax: LaTeX (a report's .tex), Markdown (a report's tables and lines, TensorBoard's
text), CSV for spreadsheets (records and reports: formula injection), JSON (record.json, for
other programs' strict parsers)."""
from __future__ import annotations

import csv
import json
import re

import pytest

from bench_cli.results.report.latex import table as latex_table
from bench_cli.results.report.render import latex_escape, markdown, markdown_cell, markdown_table

# every character TeX gives a meaning in running text, and the OT1 glyph swaps
LATEX_HOSTILE = ["\\input /etc/passwd", "^^5cinput", "~", "{", "}", "$x$", "a & b", "#1", "100%", "snake_case",
                 "<>|", "line\nbreak\n\npar", "tab\there", "\\\\", "\\end{table}", "\\csname x\\endcsname"]
LATEX_COMMANDS = re.compile(r"\\(textbackslash|textasciicircum|textasciitilde|textless|textgreater|textbar)\{\}"
                            r"|\\[&%$#_{}]")


@pytest.mark.parametrize("text", LATEX_HOSTILE)
def test_latex_escape_leaves_no_character_tex_would_interpret(text):
    shown = latex_escape(text)
    bare = LATEX_COMMANDS.sub("", shown)  # what is left after the escapes themselves
    assert not set(bare) & set("\\^~{}$&#%_<>|"), (text, shown)
    assert "\n" not in shown and "\t" not in shown  # a blank line in a cell ends the paragraph: an error


def test_latex_escape_prints_the_text_back():
    """Each escape is the text command for its own character (reading the commands back gives the text)."""
    back = {"textbackslash": "\\", "textasciicircum": "^", "textasciitilde": "~", "textless": "<", "textgreater": ">",
            "textbar": "|"}
    text = "\\input{x} ^ ~ $ & # % _ < > |"
    unescaped = re.sub(r"\\(\w+)\{\}", lambda m: back[m.group(1)], latex_escape(text))
    assert re.sub(r"\\([&%$#_{}])", r"\1", unescaped) == text


def test_a_latex_table_of_hostile_names_holds_them_as_text():
    class Cell:
        def __init__(self, mean):
            self.mean, self.std, self.n, self.values = mean, 0.1, 2, [0, 1]

    names = ["\\input /etc/passwd", "x^y~z"]
    tex = latex_table(title="caption \\def", name="hostile", metric="accuracy", datasets=["set_1 & \\x"],
                      labels=names, cells={("set_1 & \\x", n): Cell(0.5) for n in names},
                      paper_of=lambda dataset, model: None, avg=None, higher_is_better=True)
    assert "\\input" not in tex and "\\def" not in tex and "\\x" not in tex.replace("\\textbackslash{}x", "")
    assert "\\textbackslash{}input /etc/passwd" in tex and "x\\textasciicircum{}y\\textasciitilde{}z" in tex


MARKDOWN_HOSTILE = ["a|b", "a\\|b", "line\nbreak", "cr\r\nlf", "<script>alert(1)</script>", "<img src=x onerror=y>",
                    "[click](javascript:alert(1))", "![img](http://x/y.png)", "[ref][1]", "`code | span`",
                    "trailing\\", "<http://autolink>"]


def cells_of(row: str) -> list[str]:
    """A GFM table row split as GFM splits it: at pipes not escaped by a backslash."""
    return [c.strip() for c in re.split(r"(?<!\\)((?:\\\\)*)\|", row.strip()[1:-1])[::2]]


@pytest.mark.parametrize("text", MARKDOWN_HOSTILE)
def test_a_markdown_cell_stays_one_cell_of_text(text):
    lines = markdown_table([[text, "next"]], ["name", "other"])
    assert len(lines) == 3  # no line break reached the table
    assert cells_of(lines[2])[-1] == "next" and len(cells_of(lines[2])) == 2, lines[2]
    cell = markdown_cell(text)
    assert "<" not in cell and "](" not in cell.replace("\\](", "") and "][" not in cell.replace("\\][", "")
    assert re.search(r"(?<!\\)`", cell) is None


def test_a_markdown_reports_lines_hold_names_as_text():
    md = markdown("title <b>\nsecond", ["dataset a\nb", "<iframe>"], [["x|y", "1"]], ["note\nsplit <i>"], ["c1", "c2"])
    assert "<" not in md
    assert "# title &lt;b> second\n" in md and "- dataset a b\n" in md and "note split &lt;i>" in md


FORMULA_CELLS = ["=1+2", "+1+cmd", "-2+3", "@SUM(A1)", "\tcell", "\rcell", "=HYPERLINK(\"http://x\")", "'quoted"]


def test_records_and_report_csvs_never_start_a_formula_and_read_back(workdir):
    from bench_cli.results.csv_store import COLUMNS, read_records, write_rows
    from bench_cli.results.report.render import write_csv

    write_rows("res.csv", [{"model": text, "seed": "0"} for text in FORMULA_CELLS], COLUMNS, append=False)
    with open("res.csv", newline="") as f:
        models = [row["model"] for row in csv.DictReader(f)]
    assert all(not m.startswith(("=", "+", "-", "@", "\t", "\r")) for m in models), models
    # unescaped when read back; a carriage return as a line feed (a bare CR would split the row)
    assert [r["model"] for r in read_records("res.csv")] == [t.replace("\r", "\n") for t in FORMULA_CELLS]
    rows = [{"dataset": text, "model": "m", "n": 1, "n_failed": 0, "mean": -0.5} for text in FORMULA_CELLS]
    write_csv(workdir / "report.csv", rows, None, [])
    with open(workdir / "report.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert all(not r["dataset"].startswith(("=", "+", "-", "@", "\t", "\r")) for r in written)
    assert {r["mean"] for r in written} == {"-0.5000"}  # a negative number stays a number


def test_record_json_is_strict_json_with_non_finite_numbers(workdir):
    from bench_cli.results.run_folder import write_record

    row = {"run_id": "r", "status": "nan", "test_score": float("nan"), "val_loss": float("inf"),
           "metrics_json": {"history": [{"loss": float("-inf")}]}, "model": "\u2028</script>"}
    (workdir / "run").mkdir()
    write_record(workdir / "run", workdir / "res.csv", row)
    text = (workdir / "run" / "record.json").read_text()

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    record = json.loads(text, parse_constant=refuse)  # as JavaScript's JSON.parse or jq read it
    assert record["test_score"] == "nan" and record["val_loss"] == "inf"
    assert record["metrics_json"]["history"][0]["loss"] == "-inf" and record["model"] == "\u2028</script>"


@pytest.mark.parametrize("name, content", [("record.json", "[1, 2]"), ("record.json", "\x00\xff garbage"),
                                           ("run.json", '"a string"'), ("run.json", "{cut short")])
def test_a_damaged_run_file_is_a_damaged_run_in_ls(workdir, capsys, name, content):
    from bench_cli.commands.cli import main

    run = workdir / "outputs" / "runs" / "2026-01-01" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / name).write_text(content)
    main(["ls", "runs"])
    out = capsys.readouterr().out
    assert f"damaged {name}" in out and "Traceback" not in out
