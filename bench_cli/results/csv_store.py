"""The records file: one CSV row per run, successful or not, read and written strictly.

The file is never modified in place: each append writes the old rows plus the new one to a
temporary file in the same directory and atomically renames it over the original, under a lock
(:func:`locked`, also held by the job claims beside it), so a crash mid-write (or two parallel jobs)
cannot corrupt earlier rows. The same writer (:func:`write_rows`) writes the CSVs of `attnbench
profile` and the reports. Every reader reads strictly (:func:`read_table`): a corrupt row is an
error naming its line, never rows silently absorbed. Cells that a spreadsheet would run as a
formula are escaped (:func:`escape_cell`).
"""
from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench_cli.core.errors import UserError, warn_once
from bench_cli.core.files import unwritable_folder, write_atomically
from bench_cli.results.schema import COLUMNS, IDENTITY  # the schema names the columns


LOCK_NOTICE_AFTER_S = 2.0  # a lock held longer than this is announced (another process writes)


@contextmanager
def locked(path: Path):
    """The CSV's lock file held exclusively. When another process holds it for more than a moment,
    one line on stderr says what is waiting for what, instead of a silent pause."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "w") as lock:
        deadline = time.monotonic() + LOCK_NOTICE_AFTER_S
        while True:  # poll briefly; past the deadline say so once, then block
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    print(f"waiting for {lock_path} (another process is writing {path.name}; "
                          f"the record is written when it lets go)", file=sys.stderr, flush=True)
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    break
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def target(path: str | Path) -> Path:
    """The file the records of ``path`` go to: a symbolic link is written through (its target
    gets the rows, the link stays a link)."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


def check_results_path(path: str | Path) -> None:
    """Before a run: ``path`` can take records -- its folder exists or can be made and is writable,
    and an existing file is an attnbench record file (its header starts with the record columns)
    that reads strictly and takes appends (:func:`check_appendable`)."""
    path = target(path)
    probe = unwritable_folder(path.parent)
    if probe is not None:
        raise UserError(f"results.path={path}: cannot write in {probe} (read-only or not a folder); "
                        f"choose another results.path=FILE")
    if path.exists():
        if not path.is_file():
            raise UserError(f"results.path={path} is not a file")
        with open(path, newline="", errors="replace", encoding="utf-8-sig") as f:  # a BOM is read as `report` reads it
            first = f.readline().strip()
        header = first.split(",")
        if first and header[: len(IDENTITY)] != list(IDENTITY):
            raise UserError(f"results.path={path} is not an attnbench record file (its first line is not a record "
                            f"header); choose another results.path=FILE")
        if not os.access(path, os.W_OK):
            raise UserError(f"results.path={path} is read-only; choose another results.path=FILE")
        check_appendable(path, read_table(path))


def check_appendable(path: Path, table: Table | None) -> None:
    """Refuse to append to a file with rows wider than its header (a newer version's): the
    rewrite could only drop their extra fields or give them names it cannot know."""
    wide = table.wide_rows() if table else []
    if wide:
        raise RecordsFileError(f"{path} line {wide[0]}: the row has more fields than the header (written by another "
                               f"version of attnbench?); nothing is appended to this file, so as not to reshape that "
                               f"row: choose another results.path=FILE, or move such rows to a file of their own")


class RecordsFileError(UserError):
    """A records file that cannot be read, or appended to, as it is (one line naming the file and line)."""


@dataclass
class Table:
    """A CSV file as it is: its header, each row's fields as written (an incomplete row is shorter
    than the header, a newer version's row longer) and the file line each row starts on."""
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    bom: bool = False  # the file starts with a UTF-8 byte order mark (a spreadsheet's export): kept

    def wide_rows(self) -> list[int]:
        """Lines of the rows with more fields than the header."""
        return [line for line, r in zip(self.lines, self.rows) if len(r) > len(self.header)]

    def records(self, first: int = 0) -> list[dict]:
        """The rows from row ``first`` on as column -> value, cells unescaped (:func:`unescape_cell`);
        a field an incomplete row lacks is None, fields beyond the header are left out."""
        return [{k: (unescape_cell(r[i]) if i < len(r) else None) for i, k in enumerate(self.header)}
                for r in self.rows[first:]]


def read_table(path: str | Path) -> Table | None:
    """The CSV at ``path`` read strictly (None: no file or an empty one), for every reader of
    records (report, sweep resume, the writer itself).

    A row whose quote is never closed, or that runs over several lines with the wrong number of
    fields, is a corrupt file: a RecordsFileError names the file and the line, since reading on
    would silently absorb the rows after it. A row with fewer fields than the header (a line
    another tool left half-written) is kept as it is, with one warning naming its line; a row
    with more fields (a newer version's) is kept too (:func:`read_records` warns, writers refuse)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RecordsFileError(f"{path} is not a text CSV file ({e.reason} at byte {e.start})") from None
    bom = text.startswith(BOM)
    lines = list(io.StringIO(text[len(BOM):] if bom else text, newline=""))  # the physical lines, endings kept
    reader = csv.reader(lines, strict=True)
    table = None
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            if start != len(lines) or "unexpected end of data" not in str(e):
                raise _corrupt(path, start, reader.line_num, str(e)) from None
            fields = next(csv.reader(lines[start - 1:]))  # the last line, cut inside a quoted field
        if not fields:  # a blank line
            continue
        if table is None:
            table = Table(fields, bom=bom)
            continue
        n, width = len(fields), len(table.header)
        if reader.line_num > start and n != width:
            raise _corrupt(path, start, reader.line_num, f"{n} fields where the header has {width}")
        if n < width:
            # once per file, line and process: readers of one file (plan, resume, report) share it
            warn_once(f"warning: {path} line {start}: incomplete row ({n} of {width} fields; a half-written "
                      "line?): kept as it is, its missing fields read as blank")
        table.rows.append(fields)
        table.lines.append(start)
    return table


def _corrupt(path: Path, start: int, end: int, problem: str) -> RecordsFileError:
    where = f"line {start}" if end <= start else f"line {start} (a row running on to line {end})"
    return RecordsFileError(f"{path} {where}: corrupt CSV, {problem} (an unterminated quote?); the file is left "
                            f"as it is: fix or remove that row")


def read_records(path: str | Path) -> list[dict]:
    """The rows of the records file at ``path`` (none when it does not exist), read strictly
    (:func:`read_table`, :meth:`Table.records`): fields beyond the header are left out, with one
    warning (no name can be known for them)."""
    table = read_table(path)
    if table is None:
        return []
    for line in table.wide_rows():
        warn_once(f"warning: {Path(path)} line {line}: the row has more fields than the header (written by another "
                  "version?): the fields beyond the header have no column name and are not read")
    return table.records()


def write_rows(path: str | Path, rows: list[dict], columns: list[str] = COLUMNS, *, append: bool = True) -> None:
    """Write ``rows`` to the CSV at ``path``, after its rows (``append``) or instead of them.

    The one CSV writer (run records, profile points). Under the lock, the whole file is written to a
    temporary file in the same directory and renamed over the original, so a crash mid-write or a
    parallel writer cannot corrupt earlier rows. The header is the file's own (when appending),
    then ``columns`` it lacks, then every other key in the order it first appears: unknown keys
    become new columns at the end and older rows get blanks; existing columns never move. Earlier
    rows are written back field for field (an incomplete row stays incomplete); a file that does
    not read strictly, or has rows wider than its header, is refused (:func:`read_table`,
    :func:`check_appendable`). A symbolic link is written through: its target gets the rows and
    the link stays a link.
    """
    path = target(path)
    with locked(path):
        old = read_table(path) if append else None
        check_appendable(path, old)
        header = list(old.header) if old else []
        header += [c for c in columns if c not in header]
        for r in rows:
            header += [k for k in r if k not in header]
        buf = io.StringIO(BOM if old and old.bom else "")
        buf.seek(0, io.SEEK_END)
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        for fields in old.rows if old else []:  # complete rows get blanks for new columns, others stay as they are
            writer.writerow(fields + [""] * (len(header) - len(fields)) if len(fields) == len(old.header) else fields)
        for r in rows:
            writer.writerow([escape_cell(_cell(r.get(k))) for k in header])
        write_atomically(path, buf.getvalue())


def append_record(path: str | Path, row: dict) -> None:
    """Append one run record (``COLUMNS`` first)."""
    write_rows(path, [row])


BOM = "\ufeff"
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def escape_cell(text: str) -> str:
    """``text`` as a CSV cell a spreadsheet shows as text: a leading apostrophe before a cell that
    would start a formula (``=1+2`` -> ``'=1+2``), and before one that starts with an apostrophe
    already, so that :func:`unescape_cell` gives back the original; numbers (-0.5, -inf) stay
    numbers. Every writer of records and reports (``write_rows``) escapes; ``read_records``
    unescapes. A carriage return inside a cell becomes a line feed: the csv module quotes a cell
    for its line terminator (LF) only, and a bare CR ends the line for every reader, splitting the row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.startswith("'") or (text.startswith(FORMULA_STARTS) and not (text[0] in "+-" and _is_number(text))):
        return "'" + text
    return text


def unescape_cell(text: str) -> str:
    return text[1:] if text.startswith("'") else text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)
