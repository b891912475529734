"""`attnbench ls datasets`: every dataset with its status and the path it is read from (or would
be), relative to the data root named once, within 80 columns and no name cut; and each fetcher's
path is where the files written in the official formats are found."""
from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

from bench_cli.commands.cli import main
from attnbench.tasks import available_tasks, task_class
from attnbench.tasks.fetch import fetcher


def test_ls_datasets_shows_where_each_dataset_goes_in_80_columns(workdir, capsys):
    main(["ls", "datasets"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    root = str(workdir / "data")  # a path longer than the console is never cut: the title's alone may be longer
    assert all(len(line.rstrip()) <= 80 for line in lines[1:]), [ln for ln in lines if len(ln.rstrip()) > 80]
    assert lines[0] == f"datasets (data root: {root})" and root not in out[len(lines[0]):]  # named once
    words = set(out.split())
    for task in available_tasks():
        assert task in words and all(ds in words for ds in task_class(task).datasets(workdir / "data")), task
    rows = [line.split() for line in lines]
    for expected in ("hopper-medium-v2 missing d4rl/hopper_medium-v2.hdf5", "anki missing spa-eng/spa.txt",
                     "aan missing lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv",
                     "EthanolConcentration missing uea/EthanolConcentration/",
                     "JapaneseVowels in package sktime/datasets/data/JapaneseVowels/",
                     "lra_retrieval (attnbench data lra)", "d4rl (attnbench data d4rl DATASET)"):
        assert expected.split() in rows, expected


def test_a_row_wider_than_the_console_puts_its_path_below_whole(workdir, capsys):
    folder = workdir / "data" / "wikitext" / ("a_corpus_with_a_long_name_" * 2)
    for split in ("train", "valid", "test"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"wiki.{split}.tokens").write_text(" a b \n")
    main(["ls", "datasets"])
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(folder.name))
    assert lines[at].split() == [folder.name, "local"]
    assert lines[at + 1] == f"    wikitext/{folder.name}/wiki.{{train,valid,test}}.tokens"


def expand(pattern: str) -> list[str]:
    """The paths a location names: {a,b} alternatives, then * and <wnid> as globs (ImageNet's
    *.JPEG: any image, as ImageFolder reads them; the fixtures are PNGs)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match:
        return [p for alt in match.group(1).split(",")
                for p in expand(pattern[:match.start()] + alt + pattern[match.end():])]
    return glob.glob(pattern.replace("<wnid>", "*").replace("*.JPEG", "*"))


@pytest.mark.parametrize("family", ["lra_image", "lra_text", "lra_retrieval", "lra_pathfinder", "textcls", "nmt",
                                    "deit", "d4rl"])
def test_each_datasets_path_is_where_its_files_are(family, workdir):
    from test_smoke_plan import WRITERS

    from bench_cli.commands.smoke import FAMILIES
    from bench_cli.config import compose

    data = workdir / "data"
    WRITERS[family](data, family)
    (f,) = [f for f in FAMILIES if f.task == family]
    dataset = str(compose.compose([f"task={family}", *f.overrides]).task.dataset)
    source = fetcher(task_class(family).fetcher)
    location = source.location(dataset, data)
    assert source.status(dataset, data) == "local" and location.startswith(str(data)), location
    for part in location.split(" + "):
        found = expand(part)
        assert found and all(Path(p).exists() for p in found), part
