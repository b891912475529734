"""`attnbench report NAME`: the records of an experiment next to the paper's numbers.

For every (dataset, row): mean and sample standard deviation over seeds of the experiment's ``ok``
records, the paper's mean and std (``results/paper/*.csv``), the difference, whether it is within
the tolerance max(2 x paper std, floor) (floor: ``report.tolerance_floor``, 1 point by default),
and Welch's t-test of the two means with their n. Missing runs are gaps, never zeros; a row of the
grid without any record (a model not run) is named once in the notes instead of a gap per dataset;
the average row covers only the datasets where every row shown has results. Output: a rich table, and
``<out>/<NAME>.md`` + ``.csv``; ``logger=wandb`` logs the table too.

Where things are:
- spec.py    the one column spec (``report.columns``, ``report.rows_by``) and the efficiency columns
- select.py  which records count, into which cells (reads record columns only)
- paper.py   the paper's numbers
- stats.py   the comparison: tolerance, Welch, averages, ratios to the baseline
- render.py  cells, Markdown, CSV (values formatted by bench_cli.core.ui); the printed width (--width,
             COLUMNS, the terminal's, else 80) and the wrapping that never breaks a word
- experiment.py an experiment's report: the header, the notes, the command that rewrites the file, writing
  (the command line is parsed in bench_cli/commands/report.py)
- grouped.py ``attnbench report [--records FILE]`` without NAME: any records file, grouped by the
             columns whose values differ between rows, mean and std over seeds
Every report counts each job_key once (its latest ok row; bench_cli.results.job_records) and says so.

The experiment config's ``report:`` (not part of a run's identity): title, paper_csv,
paper_tables (the first listed table with a value wins), paper_n (the paper's runs per mean, for
Welch), paper_models / paper_datasets (our name -> the paper's), baseline (softmax) and
baseline_experiment (the baseline's runs from another experiment with the same setup),
tolerance_floor, higher_is_better, notes (a mapping of sentences for the Markdown), rows_by and
columns (spec.py).
"""
from __future__ import annotations

from bench_cli.results.report.experiment import grid_axes
from bench_cli.results.report.paper import PaperTable, PaperValue, load_paper, matches, paper_dir
from bench_cli.results.report.render import csv_rows, display_rows, headers, markdown, write_csv
from bench_cli.results.report.select import Cell, aggregate, common_overrides, override_value, record_value
from bench_cli.results.report.spec import EFFICIENCY, Column, Layout, layout
from bench_cli.results.report.stats import average_row, build_rows, tolerance, welch

__all__ = ["EFFICIENCY", "Cell", "Column", "Layout", "PaperTable", "PaperValue", "aggregate", "average_row",
           "build_rows", "common_overrides", "csv_rows", "display_rows", "grid_axes", "headers",
           "layout", "load_paper", "markdown", "matches", "override_value", "paper_dir", "record_value",
           "tolerance", "welch", "write_csv"]
