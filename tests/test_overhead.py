"""What the harness adds to a job (kept small so timings measure the attention): no host read of a
tensor inside the training step loop.

A real ``Trainer.fit`` (composed default config, the UEA fixture, several steps per epoch, an
evaluation every 2nd epoch) runs with every way of reading a tensor on the host wrapped
(``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``float()``, ``int()``, ``bool()``, ``__index__``):
on CUDA each is a host-device sync. Between evaluations none may happen; at evaluations they do
(the running loss is read there), which shows the wrapping sees them.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from bench_cli.engine import trainer
from bench_cli.engine.env import seed_everything
from bench_cli.config.compose import compose
from attnbench.tasks.uea import UEAClassification

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.batch_size=8", "trainer.progress=false", "trainer.max_epochs=4",
        "trainer.eval_every_epochs=2"]

HOST_READS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")
# Host tensors by design, never on the device, so reading them is no sync: torch's optimisers keep
# their step counters on the host unless `capturable` (torch/optim/*.py _get_value), and the data
# loader draws its seeds and shuffled indices on the host (torch/utils/data), and so do the sample
# transforms it applies (the keras ViT augmentation draws its angle and zoom per image: in the
# loader's workers in a real run). Their own reads are not counted.
HOST_SIDE = (*(os.sep + os.path.join("torch", *part) + os.sep for part in (("optim",), ("utils", "data"))),
             os.sep + os.path.join("tasks", "vision", "transforms.py"))


class HostReads:
    """Wraps the host reads of torch.Tensor; counts them by phase: 'steps' (inside the loop, outside
    evaluations) and 'evaluation'."""

    def __init__(self, monkeypatch):
        self.phase, self.seen = None, Counter()
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(name, getattr(torch.Tensor, name)))

    def counted(self, name, original):
        reads = self

        def read(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if reads.phase and not any(part in caller for part in HOST_SIDE):
                reads.seen[(reads.phase, name, f"{os.path.basename(caller)}:{sys._getframe(1).f_lineno}")] += 1
            return original(tensor, *args, **kwargs)

        return read

    def during(self, phase, method):
        reads = self

        def wrapped(*args, **kwargs):
            outer, reads.phase = reads.phase, phase
            try:
                return method(*args, **kwargs)
            finally:
                reads.phase = outer

        return wrapped

    def in_phase(self, phase) -> dict:
        return {k[1:]: n for k, n in self.seen.items() if k[0] == phase}


def fit_counting_host_reads(cfg, task, monkeypatch) -> tuple[trainer.TrainResult, HostReads]:
    """``Trainer.fit`` of the task's model (protocol 'paper', seed 0) with the host reads counted."""
    seed_everything(0)
    task.setup("paper")
    seed_everything(0)
    model = task.build_model(cfg.model)
    reads = HostReads(monkeypatch)
    monkeypatch.setattr(trainer._Loop, "run", reads.during("steps", trainer._Loop.run))
    monkeypatch.setattr(trainer._Loop, "evaluate_and_select", reads.during("evaluation", trainer._Loop.evaluate_and_select))
    return trainer.Trainer(cfg.trainer, task, model, torch.device("cpu"), seed=0).fit("paper"), reads


def assert_no_host_read_between_evaluations(result, reads) -> None:
    assert result.schedule.steps_per_epoch >= 4 and result.epochs_run == 4
    assert [row["epoch"] for row in result.history] == [1, 2, 4]
    assert reads.in_phase("steps") == {}, "host reads inside the step loop (file:line: count)"
    assert reads.in_phase("evaluation"), "the wrapped reads saw nothing at the evaluations"


def test_no_host_read_between_evaluations(uea_fixture, monkeypatch):
    cfg = compose([*TINY, "task.protocol=paper"])
    result, reads = fit_counting_host_reads(cfg, UEAClassification(cfg.task, cfg.paths.data_root), monkeypatch)
    assert result.train_metrics_source != "batches"
    assert_no_host_read_between_evaluations(result, reads)


# The mnist5k ViT (real digits shipped offline) shrunk as tests/test_vision.py's SMALL_VIT: its trainer
# sums the task's metrics over the training batches (trainer.train_metrics=batches).
TINY_VIT = ["task=vit", "task.protocol=paper", "task.subset.train=40", "task.subset.test=10",
            "task.backbone.image_size=28", "task.backbone.patch_size=14", "task.backbone.d_model=8",
            "task.backbone.d_ff=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1", "task.augment.flip=false",
            "task.augment.rotation=0", "task.augment.zoom=0", "trainer.batch_size=8", "trainer.progress=false",
            "trainer.max_epochs=4", "trainer.eval_every_epochs=2"]


def test_training_batch_metrics_are_summed_on_the_device(workdir, monkeypatch):
    """train_metrics=batches: accuracy, top-5 accuracy and loss of every training batch are summed
    on the device (bench_cli/core/metrics.py) and read at the evaluations only."""
    from bench_cli.config.taskfit import build_task

    cfg = compose(TINY_VIT)
    result, reads = fit_counting_host_reads(cfg, build_task(cfg), monkeypatch)
    assert result.train_metrics_source == "batches"
    assert_no_host_read_between_evaluations(result, reads)
    assert {"train_accuracy", "train_top5_accuracy"} <= set(result.history[-1])


def test_measurement_is_reused_for_the_same_shapes_and_not_for_value_reading_models(uea_fixture, monkeypatch):
    """The second job of the same model config and example batch (another seed: other weights) gets
    the first one's FLOPs and memory from the cache under the results folder, without measuring;
    a model whose forward reads a tensor value (ValueReads) is measured every time."""
    from bench_cli.engine import measure
    from bench_cli.engine.objective import Objective
    from bench_cli.config.taskfit import build_task
    from bench_cli.engine.counting import ValueReads
    from bench_cli.engine.measure import measure_run

    cfg = compose([*TINY, "results.path=res/runs.csv"])
    task = build_task(cfg)
    task.setup("holdout")
    measured = []
    real = measure.measure_model
    monkeypatch.setattr(measure, "measure_model", lambda *a, **k: measured.append(1) or real(*a, **k))

    def job(seed):
        torch.manual_seed(seed)
        model = task.build_model(cfg.model)
        return measure_run(task, model, cfg, torch.device("cpu"), Objective(task))

    first, second = job(0), job(1)
    assert len(measured) == 1 and len(list((uea_fixture.parents[2] / "res" / ".measure_cache").glob("*.json"))) == 1
    for key in ("params", "flops_forward", "flops_train_step", "peak_mem_train_bytes", "peak_mem_infer_bytes"):
        assert first[key] == second[key], key
    assert first["measure_time_s"] > 0 and second["measure_time_s"] >= 0

    with ValueReads() as reads:
        x = torch.randn(4)
        x * 2
    assert not reads.seen
    with ValueReads() as reads:
        float(x.sum()), x[x > 0]
    assert reads.seen == {"_local_scalar_dense", "index"}


def test_training_runs_with_the_setup_frozen_and_unfreezes_after_a_failure(monkeypatch):
    """The setup's objects are out of the collector's sight while training only: a sweep worker's
    next job must be able to collect them, also after a job that failed. A process that froze
    objects of its own before the run (this test worker: tests/conftest.py) keeps them frozen."""
    import gc

    from bench_cli.engine import runner
    from bench_cli.engine.runner import setup_frozen

    gc.unfreeze()  # a process that has frozen nothing, as `attnbench run` and a sweep worker start
    monkeypatch.setattr(runner, "_caller_froze", False)
    try:
        with pytest.raises(RuntimeError):
            with setup_frozen():
                assert gc.get_freeze_count() > 0
                raise RuntimeError("a job that fails while training")
        assert gc.get_freeze_count() == 0
    finally:
        gc.collect()
        gc.freeze()  # the worker's own freeze, as conftest made it
    frozen = gc.get_freeze_count()
    monkeypatch.setattr(runner, "_caller_froze", False)  # a caller's freeze not seen yet: found by the run
    with setup_frozen():
        pass
    assert gc.get_freeze_count() == frozen, "a run undid the freeze of the process that called it"
    assert runner._caller_froze  # and the later runs of this process take it as kept


def test_bench_overhead_bare_loop_does_the_runs_work_and_both_split_their_stages(uea_fixture, workdir, capsys):
    """`attnbench bench-overhead`'s two sides on the same config: the bare loop (the resolved config
    loaded as YAML, no Hydra) reaches the run's exact test metric, and both report the stages that
    the benchmark subtracts (startup, compose, data, model, fit; the run also validate, measure and
    record), each a duration inside the process's age."""
    import json

    from omegaconf import OmegaConf

    from bench_cli.commands.cli import main
    from bench_cli.commands.profile import overhead
    from bench_cli.results.csv_store import read_records

    overrides = [*TINY, "seed=0", "results.path=res.csv"]
    main(["run", *overrides])
    (row,) = read_records(workdir / "res.csv")
    phases = json.loads((Path(row["output_dir"]) / "phases.json").read_text())
    assert {"compose", "validate", "data", "model", "fit", "measure", "record", "train_time_s"} <= phases.keys()
    assert 0 < phases["train_time_s"] <= phases["fit"] < phases["process_age_s"]

    config = workdir / "bare.yaml"
    config.write_text(OmegaConf.to_yaml(compose(overrides), resolve=True))
    capsys.readouterr()
    overhead.bare_main(str(config))
    bare = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert bare["test"] == float(row["test_score"])
    assert {"compose", "data", "model", "fit"} <= bare["phases"].keys() and 0 < bare["train_s"] <= bare["phases"]["fit"]
    split = overhead.stages({"phases": phases, "process_s": phases["process_age_s"] + 0.5, "train_s": phases["train_time_s"]})
    assert list(split) == list(overhead.STAGES) and split["exit"] == pytest.approx(0.5)
