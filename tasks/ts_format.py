"""A reader of the `.ts` format (the UEA / UCR / Monash archives' text format), without sktime.

It reads as sktime 1.2.0's ``load_from_tsfile_to_dataframe`` (sktime/datasets/_readers_writers/ts.py)
reads a file without timestamps, rule for rule, so that a dataset's series and labels are the ones
the archive's own tools give: every line is stripped and lower-cased before it is read (class labels
come out lower-case, as sktime gives them), ``?`` is a missing value (NaN), the header must name
``@problemName``, ``@timeStamps``, ``@univariate`` and ``@classLabel`` or ``@targetLabel`` before
``@data``, other ``@`` lines and ``#`` comments before ``@data`` are skipped, every data line holds
the same number of dimensions (values separated by ``,``, dimensions by ``:``, the label last) and a
dimension may be empty. Timestamped files (``@timeStamps true``: ``(t, v)`` pairs) are refused: no
archive of ours has them, and their times would be lost in an array of values.

Why not sktime itself: importing it takes about 2 s of CPU (pandas, scikit-learn, scipy) and its
reader builds a pandas Series per channel of each series; every process that reads a dataset the
first time (each sweep job, each DDP rank) paid that.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


class TsFormatError(ValueError):
    """The file breaks the format; the message says how (sktime's wording)."""


# Header tags whose value is one word, true or false (sktime: "@timestamps true").
BOOLEAN_TAGS = ("@timestamps", "@univariate")
REQUIRED_TAGS = ("@problemname", "@timestamps", "@univariate", "@classlabel or @targetlabel")


def read_labelled_ts(path: Path) -> tuple[list[np.ndarray], list[str]]:
    """The series of a labelled `.ts` file, each a float64 array (length, channels) with NaN for
    missing values and for the ends of channels shorter than the series' longest one, and their
    labels as written (lower-case). Raises TsFormatError for a file that breaks the format, has no
    labels or has timestamps."""
    seen: set[str] = set()
    labelled = data_started = False
    channels = None
    series: list[np.ndarray] = []
    labels: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip().lower()
            if not line:
                continue
            tag = next((t for t in ("@problemname", *BOOLEAN_TAGS, "@classlabel", "@targetlabel", "@data")
                        if line.startswith(t)), None)
            if tag is not None and tag != "@data" and data_started:
                raise TsFormatError("metadata must come before data")
            tokens = line.split(" ")
            if tag == "@problemname":
                if len(tokens) == 1:
                    raise TsFormatError("problemname tag requires an associated value")
                seen.add(tag)
            elif tag in BOOLEAN_TAGS:
                if len(tokens) != 2 or tokens[1] not in ("true", "false"):
                    raise TsFormatError(f"{tag[1:]} tag requires an associated Boolean value (true or false)")
                if tag == "@timestamps" and tokens[1] == "true":
                    raise TsFormatError("timestamped series (@timeStamps true) are not read: "
                                        "write the values without their times")
                seen.add(tag)
            elif tag in ("@classlabel", "@targetlabel"):
                if len(tokens) == 1 or tokens[1] not in ("true", "false"):
                    raise TsFormatError(f"{tag[1:]} tag requires an associated Boolean value (true or false)")
                labelled = tokens[1] == "true"
                if tag == "@classlabel" and labelled and len(tokens) == 2:
                    raise TsFormatError("if the classlabel tag is true then class values must be supplied")
                if tag == "@targetlabel" and len(tokens) > 2:
                    raise TsFormatError(f"targetlabel tag should not be accompanied with info apart from "
                                        f"true/false, but found {tokens}")
                seen.add("@classlabel or @targetlabel")
            elif tag == "@data":
                if line != "@data":
                    raise TsFormatError("data tag should not have an associated value")
                data_started = True
            elif data_started:
                if missing := [t for t in REQUIRED_TAGS if t not in seen]:
                    raise TsFormatError(f"a full set of metadata has not been provided before the data "
                                        f"(no {', '.join(missing)})")
                if not labelled:
                    raise TsFormatError("the cases have no associated class values")
                *dimensions, label = line.replace("?", "NaN").split(":")
                if channels is None:
                    channels = len(dimensions)
                elif len(dimensions) != channels:
                    raise TsFormatError(f"inconsistent number of dimensions. Expecting {channels} "
                                        f"but have read {len(dimensions)}")
                values = [[float(v) for v in d.split(",")] if d.strip() else [] for d in dimensions]
                array = np.full((max(map(len, values)), channels), np.nan)
                for j, column in enumerate(values):
                    array[: len(column), j] = column
                series.append(array)
                labels.append(label.strip())
    if not data_started:
        raise TsFormatError("no @data line: the file holds no series")
    if not series:
        raise TsFormatError("file contained metadata but no data")
    return series, labels
