"""The `.ts` reader (tasks/ts_format.py) gives what sktime's reader gives, on the datasets shipped
inside sktime and on files written here with what the archives' files hold (missing values, unequal
lengths and channels, upper-case class names, regression targets), and refuses what sktime refuses."""
from __future__ import annotations

import numpy as np
import pytest

from bench_cli.core.errors import UserError
from attnbench.tasks.timeseries import packaged_dir, read_ts
from attnbench.tasks.ts_format import TsFormatError, read_labelled_ts

SHIPPED = ["JapaneseVowels", "BasicMotions", "Covid3Month", "Tecator"]  # two classification, two regression
HEADER = "@problemName Odd\n@timeStamps false\n@missing true\n@univariate false\n@dimensions 2\n"
# A comment, blank lines, missing values, a channel shorter than the other, an empty channel, an
# exponent, spaces around values and labels, upper-case class names (sktime lower-cases every line).
WRITTEN = {
    "classes": HEADER + "# written by hand\n@classLabel true Up Down\n@data\n\n"
               "1.0,?,3.5:2.0,1e-3:Up\n -1.5 ,2.0:?,?,4: Down \n:7.0:Up\n",
    "targets": HEADER + "@targetLabel true\n@data\n1,2:3,4:0.25\n5,6,7:8:-1.5e2\n",
}


def sktime_reading(path) -> tuple[list[np.ndarray], list[str]]:
    """sktime's reader, its nested frame padded with NaN into (length, channels) arrays as attnbench
    did before it read `.ts` files itself."""
    from sktime.datasets import load_from_tsfile

    frame, labels = load_from_tsfile(str(path), return_data_type="nested_univ")
    series = []
    for row in frame.itertuples(index=False):
        channels = [np.asarray(values, dtype=np.float64) for values in row]
        array = np.full((max(map(len, channels)), len(channels)), np.nan)
        for j, values in enumerate(channels):
            array[: len(values), j] = values
        series.append(array)
    return series, labels.astype(str).tolist()


def files_to_compare(tmp_path) -> list:
    shipped = [packaged_dir(name) / f"{name}_{split}.ts" for name in SHIPPED for split in ("TRAIN", "TEST")]
    for name, text in WRITTEN.items():
        (tmp_path / f"{name}.ts").write_text(text)
    return [*shipped, *(tmp_path / f"{name}.ts" for name in WRITTEN)]


def test_series_and_labels_are_sktimes(tmp_path):
    for path in files_to_compare(tmp_path):
        series, labels = read_labelled_ts(path)
        expected_series, expected_labels = sktime_reading(path)
        assert labels == expected_labels, path
        assert len(series) == len(expected_series), path
        for ours, theirs in zip(series, expected_series):
            assert ours.dtype == np.float64 and np.array_equal(ours, theirs, equal_nan=True), path
    series, labels = read_ts(tmp_path / "classes.ts")
    assert labels.tolist() == ["up", "down", "up"] and [s.shape for s in series] == [(3, 2), (3, 2), (1, 2)]
    assert np.isnan(series[0][1, 0]) and np.isnan(series[0][2, 1]) and np.isnan(series[2][0, 0])
    _, targets = read_ts(tmp_path / "targets.ts")
    assert targets.dtype == np.float64 and targets.tolist() == [0.25, -150.0]


BROKEN = {  # what sktime refuses as well, and the words of the line attnbench prints
    "one line with a channel fewer": (HEADER + "@classLabel true a b\n@data\n1:2:a\n3:b\n", "inconsistent number of dimensions"),
    "a value that is not a number": (HEADER + "@classLabel true a b\n@data\n1,x:2:a\n", "could not convert string to float"),
    "a header without @univariate": ("@problemName Odd\n@timeStamps false\n@classLabel true a\n@data\n1:a\n",
                                     "no @univariate"),
    "data before the header ends": (HEADER + "@classLabel true a\n@data\n1:2:a\n@univariate true\n",
                                    "metadata must come before data"),
    "class labels without classes": (HEADER + "@classLabel true\n@data\n1:2:a\n", "class values must be supplied"),
    "no @data": (HEADER + "@classLabel true a\n", "no @data line"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_file_is_one_line_naming_it(tmp_path, case):
    text, words = BROKEN[case]
    path = tmp_path / "Odd_TRAIN.ts"
    path.write_text(text)
    with pytest.raises(UserError) as error:
        read_ts(path)
    message = str(error.value)
    assert message.startswith(f"cannot parse {path}: ") and words in message and "\n" not in message
    with pytest.raises((OSError, ValueError)):  # sktime refuses it too
        sktime_reading(path)


def test_timestamped_series_are_refused_not_read_without_their_times(tmp_path):
    path = tmp_path / "Stamped_TRAIN.ts"
    path.write_text("@problemName Stamped\n@timeStamps true\n@univariate true\n@classLabel true a\n@data\n"
                    "(2007-01-01 00:00:00,1.0),(2007-01-02 00:00:00,2.0):a\n")
    with pytest.raises(TsFormatError, match="timestamped series"):
        read_labelled_ts(path)
