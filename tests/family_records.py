"""One tiny run per task family, and the comparison of two such sets of records: the check that a
change of the run path leaves every number as it was (a refactoring must not change results: "one run per
family before and after gives identical records").

    # the records of the code on PYTHONPATH (e.g. main's checkout, then a branch's); data and
    # outputs in before.work/ and after.work/ beside them
    PYTHONPATH=/work/main python tests/family_records.py run before.csv
    PYTHONPATH=$PWD       python tests/family_records.py run after.csv
    python tests/family_records.py compare before.csv after.csv   # exit 1 when a number differs

Every run uses the test suite's fixtures (tests/conftest.py, test_lra.py, test_lm.py, test_text.py):
no network. Not a pytest module (the name does not start with test_): a run of every family takes a
minute or two."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

COMMON = ("trainer.progress=false", "logger=none", "seed=0", "trainer.num_threads=1", "trainer.num_workers=0")
SMALL = ("task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1")
# One run per family (two for UEA: the KSVD objective of Primal-Attention), the measurement on
# (FLOPs, memory, inference time, head diversity) where it is cheap.
RUNS = {
    "uea softmax": ("task=uea", "model=softmax", "task.dataset=Fixture", *SMALL, "task.backbone.d_ff=32",
                    "trainer.max_epochs=3", "trainer.batch_size=8", "measure.inference_samples=10"),
    "uea primalformer": ("task=uea", "model=primalformer", "task.dataset=Fixture", *SMALL, "task.backbone.d_ff=32",
                         "trainer.max_epochs=2", "trainer.batch_size=8", "measure.head_diversity=true"),
    "tser": ("task=tser", "model=softmax", "task.dataset=RegFixture", *SMALL, "task.backbone.d_ff=32",
             "trainer.max_epochs=2", "trainer.batch_size=8"),
    "lra_listops": ("task=lra_listops", "model=softmax", "task.dataset=listops", "task.backbone.d_model=16",
                    "task.backbone.d_ff=32", "trainer.max_steps=4", "trainer.eval_every_steps=2",
                    "trainer.batch_size=8", "trainer.micro_batch_size=4", "trainer.eval_batch_size=16",
                    "trainer.optimizer.name=adamw", "trainer.scheduler.name=onecycle",
                    "trainer.scheduler.warmup_steps=1", "measure.memory=false"),
    "lm": ("task=lm", "task.dataset=fixture", "model=softmax", "task.backbone.d_model=16", "task.backbone.d_ff=32",
           "task.backbone.n_layers=2", "task.backbone.n_heads=2", "task.tokens_per_sample=8",
           "task.context_window=5", "trainer.max_steps=6", "trainer.eval_every_steps=3", "trainer.batch_size=4"),
    "vit": ("task=vit", "model=super", "task.subset.train=64", "task.subset.test=32", "task.sizes.mnist5k.n_layers=1",
            "trainer.max_epochs=1", "trainer.batch_size=16", "measure.inference_samples=32",
            "measure.flops=false", "measure.memory=false"),
    "textcls": ("task=textcls", "model=super", "task.backbone.n_layers=1", "trainer.max_epochs=2",
                "trainer.batch_size=4", "trainer.eval_batch_size=4", "measure.inference_samples=8",
                "measure.flops=false", "measure.memory=false"),
}
# Columns that say when, where and how fast a run ran, not what it computed.
VOLATILE = {"run_id", "time", "output_dir", "config_path", "overrides", "command", "git_commit", "git_dirty",
            "attnbench_version", "host", "wall_time_s", "train_time_s", "measure_time_s", "peak_rss_bytes",
            "load_before", "load_after", "timing_noisy", "epoch_time_s", "epoch_time_iqr_s"}
VOLATILE_PREFIXES = ("infer_time", "epoch_time", "load_", "setup_", "time_")


def write_data(root: Path) -> None:
    """Every family's fixture under the data root ``root``."""
    import numpy as np

    from conftest import write_ts
    from test_lm import write_wikitext
    from test_lra import write_listops
    from test_text import imdb_rows, write_imdb

    rng = np.random.RandomState(0)
    for split, n in (("TRAIN", 40), ("TEST", 20)):  # tests/conftest.py uea_fixture's shape
        series = [rng.randn(rng.randint(5, 10), 3) * 0.3 + [[2.0 if i % 2 else -2.0, 0, 0]] for i in range(n)]
        write_ts(root / "uea" / "Fixture" / f"Fixture_{split}.ts", series,
                 ["up" if i % 2 else "down" for i in range(n)], ["down", "up"], missing=False)
        series = [rng.randn(rng.randint(6, 12), 2) for _ in range(n)]
        write_ts(root / "tser" / "RegFixture" / f"RegFixture_{split}.ts", series,
                 [round(float(3 * s[:, 0].mean()), 6) for s in series], None, missing=False)
    write_listops(root / "lra_release" / "listops-1000")
    write_wikitext(root / "wikitext" / "fixture")
    write_imdb(root, imdb_rows(40, 0), imdb_rows(20, 1))


def work_dir(records: str | Path) -> Path:
    """Where the runs of ``records`` keep their data and outputs (a record names its data's folder)."""
    return Path(records).resolve().with_suffix(".work")


def run_all(out: Path) -> int:
    out, work = out.resolve(), work_dir(out)
    shutil.rmtree(work, ignore_errors=True)
    write_data(work / "data")
    env = {**os.environ, "ATTNBENCH_DATA": str(work / "data"), "ATTNBENCH_OUTPUT": str(work / "outputs"),
           "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    failed = 0
    for name, args in RUNS.items():
        r = subprocess.run([sys.executable, "-m", "bench_cli.cli", "run", *args, *COMMON, f"results.path={out}"],
                           cwd=work, env=env, capture_output=True, text=True)
        print(f"{name}: exit {r.returncode}", r.stderr.strip().splitlines()[-1:] if r.returncode else "")
        failed += r.returncode != 0
    return 1 if failed else 0


def rows(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def compare(before: str, after: str) -> int:
    """The same columns in the same order; every value equal, except the volatile ones (when, where,
    how fast)."""
    # the same data in another folder: its path, named in metrics_json, made the same
    a = [{k: v.replace(str(work_dir(before)), "WORK") for k, v in r.items()} for r in rows(before)]
    b = [{k: v.replace(str(work_dir(after)), "WORK") for k, v in r.items()} for r in rows(after)]
    if len(a) != len(b):
        print(f"{len(a)} records before, {len(b)} after")
        return 1
    differ = 0
    for x, y in zip(a, b):
        if list(x) != list(y):  # the same columns in the same order
            print(f"{x['task']} {x['model']}: columns differ: {list(x)} != {list(y)}")
            differ += 1
        for column in sorted(set(x) & set(y)):
            if column in VOLATILE or column.startswith(VOLATILE_PREFIXES) or x[column] == y[column]:
                continue
            print(f"{x['task']} {x['model']}: {column}: {x[column][:120]!r} != {y[column][:120]!r}")
            differ += 1
    differ += compare_run_folders(work_dir(before), work_dir(after))
    compared = len(set(a[0]) - VOLATILE) if a else 0
    print(f"{len(a)} records, {compared} columns each (volatile ones aside): {differ} differences")
    return 1 if differ else 0


def compare_run_folders(before: Path, after: Path) -> int:
    """The run folders' files: ``config.yaml`` the same text, ``record.json`` and ``run.json`` the
    same keys in the same order."""
    differ = 0
    folders = [sorted((w / "outputs" / "runs").glob("*/*")) for w in (before, after)]
    for x, y in zip(*folders):
        if sorted(f.name for f in x.iterdir()) != sorted(f.name for f in y.iterdir()):
            print(f"{x.name} / {y.name}: other files")
            differ += 1
        for name in ("config.yaml", "record.json", "run.json"):
            texts = [(d / name).read_text().replace(str(w), "WORK").replace(str(w.with_suffix(".csv")), "RECORDS")
                     for d, w in ((x, before), (y, after))]
            same = texts[0] == texts[1] if name == "config.yaml" else list(json.loads(texts[0])) == list(json.loads(texts[1]))
            if not same:
                print(f"{x.name} / {y.name}: {name} differs")
                differ += 1
    return differ


if __name__ == "__main__":
    command, *paths = sys.argv[1:]
    sys.exit(run_all(Path(paths[0])) if command == "run" else compare(*paths))
