"""`attnbench report [NAME]`: the command line parsed, then the report of an experiment
(bench_cli/results/report/experiment.py) or, without NAME, of any records file, grouped
(bench_cli/results/report/grouped.py)."""
from __future__ import annotations

from bench_cli.core.errors import UserError, unknown_choice

USAGE = """\
usage: attnbench report [NAME] [--records PATH] [--committed PATH] [--out DIR] [--format F] [--all] [--width N]
                        [--mixed-code] [--pair A,B] [overrides...]

  NAME            an experiment (attnbench ls experiments), e.g. primal_dual/table1: its runs
                  next to the paper's numbers; of a search (tuning/uea_lr_dropout), the best trial
                  of each study. Without NAME: every run of the records file,
                  grouped by the columns whose values differ between rows (model, dataset,
                  overrides...), with the mean and std over seeds of each group, and the best
                  trial of each Optuna study in it (docs/tuning.md)
  --records PATH  the records file. Default with NAME: found by the command from any folder --
                  your runs (results/local/NAME.records.csv, results.path of the config:
                  results/runs.csv) beside the committed reproduction
                  (results/reproduced/NAME.records.csv), else the committed one alone; it says
                  which files it read. Without NAME: results.path of the config
  --committed PATH  a committed reproduction's records to compare the runs with, cell by cell
                    (make reproduce-* passes results/reproduced/NAME.records.csv)
  --out DIR       where NAME.md and NAME.csv go (without NAME: <records file name>.md/.csv;
                  default: results/local for records found by the command, else reproduced/
                  beside the records file)
  --format F      what the report writes, comma-separated: markdown, csv, latex (NAME.tex: a
                  booktabs table for a paper, model x dataset, the paper's value beside ours,
                  bold only where Welch's test separates the best); default markdown,csv. With
                  --records and no NAME: the records' experiment's report when they name one
  --all           also list the grid's datasets that have no records (as gaps)
  --width N       print N columns wide (default: COLUMNS, else the terminal's width, else 80
                  when the output is not a terminal); a wider table prints one block per row
  --no-write      print only
  --pair A,B      (without NAME) compare models A and B on the same test samples, per dataset:
                  a paired bootstrap interval of A - B from the per-sample outputs of the
                  runs (samples.npz), McNemar's test for accuracy, beside Welch's of seeds
  --mixed-code    report records of one model made by different code together (by default
                  refused, naming the modules whose hashes differ: record column code_hashes)
  logger=wandb    also log the table to Weights & Biases (with NAME)
"""
FORMATS = ("markdown", "csv", "latex")
REPORT_OPTIONS = {"--records": True, "--committed": True, "--out": True, "--format": True, "--all": False,
                  "--width": True, "--no-write": False,
                  "--mixed-code": False, "--pair": True}


def parse_report_args(args: list[str]) -> tuple[list[str], list[str], dict]:
    """(experiment names, overrides, options) of `attnbench report ARGS`."""
    from bench_cli.config.args import parse

    p = parse("report", args, REPORT_OPTIONS)
    width = p.get("--width")
    if width is not None and not (str(width).isdigit() and int(width) > 0):
        raise UserError(f"--width {width}: expected a number of columns, e.g. --width 100")
    formats = [f.strip() for f in str(p.get("--format") or "markdown,csv").split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            raise unknown_choice("--format", f, FORMATS)
    opts = {"records": p.get("--records"), "committed": p.get("--committed"), "out": p.get("--out"),
            "formats": formats, "format": p.get("--format"), "all": bool(p.get("--all")),
            "width": int(width) if width else None, "write": not p.get("--no-write"),
            "mixed_code": bool(p.get("--mixed-code")), "pair": _pair(p.get("--pair"))}
    return p.positional, p.overrides, opts


def _pair(value) -> tuple[str, str] | None:
    if value is None:
        return None
    names = [n.strip() for n in str(value).split(",") if n.strip()]
    if len(names) != 2 or names[0] == names[1]:
        raise UserError(f"--pair {value}: expected two models, e.g. --pair softmax,linear")
    return names[0], names[1]


def cmd_report(args: list[str]) -> None:
    if any(a in ("-h", "--help") for a in args):
        from bench_cli.core.ui import usage_text

        print(usage_text(USAGE))
        return
    names, overrides, opts = parse_report_args(args)
    if opts["pair"] and names:
        raise UserError("--pair compares two models of a records file: attnbench report --records FILE --pair A,B")
    if not names:
        from bench_cli.results.report.grouped import report_records

        return report_records(overrides, opts)
    from bench_cli.results.report.experiment import report_experiment

    report_experiment(names, overrides, opts)
