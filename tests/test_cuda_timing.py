"""CUDA timing and memory, checked without a GPU: the CUDA calls are replaced by
recording fakes, so the test sees which clock `seconds` reads and where it synchronises."""
from __future__ import annotations

import torch
import torch.nn as nn

from bench_cli.engine import counting, timing


class FakeEvent:
    def __init__(self, calls: list, name: str, enable_timing: bool = False):
        assert enable_timing
        self.calls, self.name = calls, name

    def record(self, stream=None):
        self.calls.append(f"{self.name}.record({stream})")

    def synchronize(self):
        self.calls.append(f"{self.name}.synchronize")

    def elapsed_time(self, end) -> float:
        return 250.0  # milliseconds, the device's clock


def test_seconds_on_cuda_reads_cuda_events_with_one_sync_before(monkeypatch):
    calls: list[str] = []
    names = iter(["start", "end"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream0")
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: FakeEvent(calls, next(names), enable_timing))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    took = timing.seconds(lambda: calls.append("work"), torch.device("cuda:0"))
    assert took == 0.25  # elapsed_time's milliseconds, not the host's clock
    assert calls == ["synchronize", "start.record(stream0)", "work", "end.record(stream0)", "end.synchronize"]
    assert timing.timer_name(torch.device("cuda:0")) == "CUDA events"


def test_seconds_on_the_cpu_is_wall_clock_without_cuda_calls(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: (_ for _ in ()).throw(AssertionError))
    assert 0 <= timing.seconds(lambda: None, torch.device("cpu")) < 1
    assert timing.timer_name(torch.device("cpu")) == "time.perf_counter"


def test_cuda_memory_is_the_allocator_peak_beside_the_fake_tensor_estimate():
    """On CUDA the record keeps the allocator's peak and, beside it, the MemTracker estimate a CPU
    run records, and says which is which. (The model sits on the CPU here: the allocator's part
    then falls back to the tracker, which does not change the columns checked.)"""
    model, x = nn.Linear(8, 4), torch.randn(16, 8)
    def measured(device):
        return counting._flops_and_memory(model, x, lambda y: y.sum(), 16, torch.device(device), flops="off",
                                          memory="real", budget_bytes=None, precision="32", into={})

    out = measured("cuda")
    assert out["peak_mem_source"] == "torch.cuda.max_memory_allocated"
    assert out["peak_mem_train_estimate_bytes"] == counting.peak_memory_train_step(model, x, lambda y: y.sum(), meta=True)
    assert out["peak_mem_infer_estimate_bytes"] == counting.peak_memory_inference(model, x, meta=True) > 0
    cpu = measured("cpu")
    assert "peak_mem_source" not in cpu  # CPU records keep their columns


def test_a_training_segment_on_cuda_waits_once_at_its_end(monkeypatch):
    """The trainer's clock (RegionTimer): an event at the start, many steps, an event at the end
    waited for once; no synchronisation per step."""
    calls: list[str] = []
    names = iter(["start", "end"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream0")
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: FakeEvent(calls, next(names), enable_timing))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    clock = timing.RegionTimer(torch.device("cuda:0"))
    clock.start()
    for _ in range(3):
        calls.append("step")
    assert clock.stop() == 0.25
    assert calls == ["start.record(stream0)", "step", "step", "step", "end.record(stream0)", "end.synchronize"]


def test_the_trainer_times_its_segments_with_the_region_timer():
    import inspect

    from bench_cli.engine import trainer

    source = inspect.getsource(trainer)
    assert "RegionTimer(trainer.device)" in source and "perf_counter" not in source
