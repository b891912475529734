"""Tests of bench_cli.engine.counting (counted FLOPs against analytic values, peak memory,
parameters) and of a run's measurement (bench_cli.engine.measure)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn
from torch.utils import flop_counter

from bench_cli.engine import counting
from attnbench.models.attention import build_attention

B, N, D, H = 2, 16, 32, 2
d = D // H
PROJ = 2 * B * N * D * D  # one (B*N, D) x (D, D) projection; the bias add is not counted
SDPA_MM = 2 * B * H * N * N * d  # one of QK^T / AV (2 FLOPs per multiply-accumulate)
CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def loss_fn(out):
    return out.square().mean()


def attention(seed=0, **options):
    torch.manual_seed(seed)
    return build_attention("softmax", d_model=D, n_heads=H, **options)


def make_inputs(kind, n=N, requires_grad=False):
    x = torch.randn(B, n, D, requires_grad=requires_grad)
    if kind == "plain":
        return {"x": x}
    if kind == "causal":
        return {"x": x, "causal": True}
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[0, n // 2:] = False  # padding in the first sequence
    return {"x": x, "mask": mask, "causal": kind == "mask+causal"}


KINDS = ["plain", "mask", "causal", "mask+causal"]


def counted_by_op(fn):
    with flop_counter.FlopCounterMode(display=False) as counter:
        fn()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


# --------------------------------------------------------------------------- FLOPs


def test_sdpa_formulas_registered_idempotently():
    assert CPU_FLASH in flop_counter.flop_registry
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward in flop_counter.flop_registry
    assert counting.ensure_sdpa_formulas() == []  # second registration is a no-op, not an error


@pytest.mark.parametrize("kind", KINDS)
def test_forward_flops_match_analytic_count(kind):
    model, inputs = attention(), make_inputs(kind)
    expected = 4 * PROJ + 2 * SDPA_MM
    assert counting.flops_forward(model, inputs) == expected
    # The attention part really is the fused CPU kernel, counted with torch's formula (not zero).
    with torch.no_grad():
        by_op = counted_by_op(lambda: model(**inputs))
    assert by_op == {"aten.addmm": 4 * PROJ, str(CPU_FLASH.default.overloadpacket): 2 * SDPA_MM}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("input_grad", [False, True])
def test_train_step_flops_match_analytic_count(kind, input_grad):
    model, inputs = attention(), make_inputs(kind, requires_grad=input_grad)
    # Backward of a linear layer: grad of the weight (1 mm) and, when needed, of its input (1 mm).
    # x needs no grad unless input_grad, so q/k/v_proj skip their input grads.
    proj = 4 * PROJ + 4 * PROJ + (4 if input_grad else 1) * PROJ
    # Fused SDPA: 2 matmuls forward, 5 backward (scores recomputed), torch's CUDA convention.
    sdpa = (2 + 5) * SDPA_MM
    assert counting.flops_train_step(model, inputs, loss_fn) == proj + sdpa


def test_train_step_with_dropout_uses_math_path_on_cpu():
    # dropout > 0 makes SDPA fall back to its math path on the CPU: plain bmm's, whose backward
    # stores the scores, so 4 backward matmuls instead of the fused kernels' 5.
    model, inputs = attention(dropout=0.1), make_inputs("mask")
    assert counting.flops_train_step(model, inputs, loss_fn) == 9 * PROJ + (2 + 4) * SDPA_MM
    assert counting.flops_forward(model, inputs) == 4 * PROJ + 2 * SDPA_MM  # eval: no dropout


def test_positional_and_single_tensor_inputs():
    model = attention()
    x = torch.randn(B, N, D)
    expected = 4 * PROJ + 2 * SDPA_MM
    assert counting.flops_forward(model, (x,)) == expected
    assert counting.flops_forward(model, x) == expected
    assert counting.flops_forward(model, [x, None, True]) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_meta_counts_equal_real_counts(kind):
    model, inputs = attention(dropout=0.1), make_inputs(kind)
    assert counting.flops_forward(model, inputs, meta=True) == counting.flops_forward(model, inputs)
    assert (counting.flops_train_step(model, inputs, loss_fn, meta=True)
            == counting.flops_train_step(model, inputs, loss_fn))


def test_meta_counts_huge_sizes_without_compute():
    n = 200_000  # a real N x N score matrix would need 2*2*n^2*4 bytes = 640 GB
    with torch.device("meta"):
        model = build_attention("softmax", d_model=D, n_heads=H)
        inputs = {"x": torch.empty(B, n, D), "mask": torch.ones(B, n, dtype=torch.bool)}
    start = time.perf_counter()
    fwd = counting.flops_forward(model, inputs, meta=True)
    train = counting.flops_train_step(model, inputs, loss_fn, meta=True)
    assert time.perf_counter() - start < 30  # generous: CI shares its cores
    proj, mm = 2 * B * n * D * D, 2 * B * H * n * n * d
    assert fwd == 4 * proj + 2 * mm
    assert train == 9 * proj + 7 * mm


def test_meta_failure_raises_clear_error():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x):
            return self.lin(x) * x.abs().max().item()

    model, x = DataDependent(), torch.randn(B, N, D)
    assert counting.flops_forward(model, (x,)) == 2 * B * N * D * D
    with pytest.raises(counting.MetaCountingError, match="meta=False"):
        counting.flops_forward(model, (x,), meta=True)


def test_measuring_does_not_disturb_training():
    model = nn.Sequential(attention(dropout=0.1), nn.BatchNorm1d(N), attention(seed=1))
    model[2].eval()
    inputs = (torch.randn(B, N, D),)
    old_grad = torch.ones_like(model[0].q_proj.weight)
    model[0].q_proj.weight.grad = old_grad
    running_mean = model[1].running_mean.clone()
    torch.manual_seed(123)
    expected_next_random = torch.rand(3)
    torch.manual_seed(123)
    counting.flops_train_step(model, inputs, loss_fn)
    counting.peak_memory_train_step(model, inputs, loss_fn)
    assert torch.equal(torch.rand(3), expected_next_random)  # RNG stream untouched
    assert model[0].q_proj.weight.grad is old_grad
    assert all(p.grad is None for name, p in model.named_parameters() if name != "0.q_proj.weight")
    assert torch.equal(model[1].running_mean, running_mean)
    assert model.training and model[0].training and not model[2].training


def test_loss_must_be_scalar():
    with pytest.raises(ValueError, match="scalar"):
        counting.flops_train_step(attention(), make_inputs("plain"), lambda out: out)


def test_per_sample():
    assert counting.per_sample(300, 3) == 100
    with pytest.raises(ValueError):
        counting.per_sample(1, 0)


# --------------------------------------------------------------------------- peak memory


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def test_peak_inference_of_linear_is_state_plus_output():
    lin = nn.Linear(D, 3 * D)
    x = torch.randn(B, N, D)
    expected = nbytes(lin.weight, lin.bias, x) + B * N * 3 * D * 4
    assert counting.peak_memory_inference(lin, (x,)) == expected
    assert counting.peak_memory_inference(lin, (x,), meta=True) == expected


def test_peak_memory_deterministic_and_train_above_inference():
    model, inputs = attention(), make_inputs("mask", n=64)
    train = [counting.peak_memory_train_step(model, inputs, loss_fn) for _ in range(2)]
    infer = [counting.peak_memory_inference(model, inputs) for _ in range(2)]
    assert train[0] == train[1] and infer[0] == infer[1]
    assert train[0] > infer[0] > nbytes(*model.parameters(), inputs["x"])
    assert counting.peak_memory_train_step(model, inputs, loss_fn, meta=True) == train[0]
    assert counting.peak_memory_inference(model, inputs, meta=True) == infer[0]


def test_garbage_left_before_a_measurement_changes_no_peak():
    """The tracked peak counts what the region allocates: reference cycles holding tensors, left
    uncollected before it (no collection runs first, and none inside), change nothing."""
    model, inputs = attention(), make_inputs("mask", n=64)
    clean = (counting.peak_memory_train_step(model, inputs, loss_fn), counting.peak_memory_inference(model, inputs))
    for _ in range(20):
        cycle = {"tensor": torch.randn(64, 64)}
        cycle["self"] = cycle
    del cycle
    dirty = (counting.peak_memory_train_step(model, inputs, loss_fn), counting.peak_memory_inference(model, inputs))
    assert dirty == clean


@pytest.mark.parametrize("meta", [False, True])
def test_the_kept_peak_is_memtrackers_own(meta, monkeypatch):
    """The tracker keeps only the global peak (counting._total_peak_tracker): on a training step
    of nested modules it equals what MemTracker itself records as the peak, on real and fake
    tensors; a torch whose MemTracker no longer calls the overridden method fails here."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = nn.Sequential(attention(), nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D)))
    inputs = make_inputs("mask", n=32)
    kept = counting.peak_memory_train_step(model, (inputs["x"],), loss_fn, meta=meta)
    monkeypatch.setattr(counting, "_total_peak_tracker", lambda: MemTracker)
    monkeypatch.setattr(MemTracker, "peak_bytes", property(
        lambda tracker: {device: snapshot["Total"] for device, snapshot in tracker.get_tracker_snapshot("peak").items()}),
        raising=False)
    own = counting.peak_memory_train_step(model, (inputs["x"],), loss_fn, meta=meta)
    assert kept == own > 2 * nbytes(*model.parameters())


class NaiveAttention(nn.Module):
    """softmax(Q K^T / sqrt(d)) V with the N x N scores materialised (no projections)."""

    def forward(self, x):
        scores = x @ x.transpose(-1, -2) / x.shape[-1] ** 0.5
        return scores.softmax(-1) @ x


def test_peak_memory_scaling_naive_quadratic_fused_linear():
    lengths = (256, 512, 1024)
    naive = [counting.peak_memory_inference(NaiveAttention(), (torch.randn(1, n, 16),)) for n in lengths]
    for n, peak in zip(lengths, naive):
        assert peak >= 2 * n * n * 4  # scores and their softmax are alive together
    assert all(b / a > 3.5 for a, b in zip(naive, naive[1:]))  # ~4x per doubling of N
    # The fused CPU flash kernel never materialises N x N (its blocks are kernel-internal),
    # so the softmax layer's tracked peak grows linearly in N.
    model = attention()
    fused = [counting.peak_memory_inference(model, {"x": torch.randn(1, n, D)}) for n in lengths]
    assert all(1.7 < b / a < 2.1 for a, b in zip(fused, fused[1:]))


def test_process_peak_rss():
    assert counting.process_peak_rss_bytes() > 10 * 2**20


# --------------------------------------------------------------------------- parameters


def test_count_and_attention_parameters():
    per_layer = 4 * (D * D + D)
    model = nn.Sequential(attention(), nn.Linear(D, D), attention(seed=1))
    assert counting.count_parameters(model) == 2 * per_layer + D * D + D
    assert counting.attention_parameters(model) == {
        "attn_params": 2 * per_layer, "attn_layers": 2, "attn_params_per_layer": per_layer}
    assert counting.attention_parameters(nn.Linear(D, D)) == {
        "attn_params": 0, "attn_layers": 0, "attn_params_per_layer": 0}


def test_nested_attention_modules_count_once():
    # A module of the attention package wrapping another one (e.g. a modifier around a kernel)
    # is one layer; only the top-most module counts.
    wrapper_cls = type("Wrapper", (nn.Module,), {"__module__": "attnbench.models.attention.test_wrapper"})
    wrapper = wrapper_cls()
    wrapper.inner = attention()
    wrapper.gate = nn.Parameter(torch.zeros(D))
    model = nn.Sequential(wrapper, nn.ReLU(), attention(seed=1))
    per_layer = 4 * (D * D + D)
    assert counting.is_attention_module(wrapper) and counting.is_attention_module(wrapper.inner)
    assert counting.attention_parameters(model) == {
        "attn_params": 2 * per_layer + D, "attn_layers": 2, "attn_params_per_layer": per_layer + D // 2}


def test_measure_model():
    model, inputs = attention(), make_inputs("mask")
    result = counting.measure_model(model, inputs, loss_fn, batch_size=B)
    assert result["params"] == result["attn_params"] == 4 * (D * D + D)
    assert result["flops_forward"] == (4 * PROJ + 2 * SDPA_MM) / B
    assert result["flops_train_step"] == (9 * PROJ + 7 * SDPA_MM) / B
    assert result["peak_mem_train_bytes"] > result["peak_mem_infer_bytes"] > 0
    assert set(result) == {"params", "attn_params", "attn_layers", "attn_params_per_layer", "flops_forward",
                           "flops_train_step", "peak_mem_train_bytes", "peak_mem_infer_bytes", "flops_method",
                           "memory_method"}
    assert result["flops_method"] == "FlopCounterMode on real tensors"
    assert result["memory_method"] == "MemTracker on real tensors (cpu)"
    off = counting.measure_model(model, inputs, loss_fn, batch_size=B, flops="off", memory="off")
    assert set(off) == {"params", "attn_params", "attn_layers", "attn_params_per_layer"}


@pytest.mark.parametrize("flops,memory", [("meta", "fake"), ("real", "real"), ("meta", "real")])
def test_a_step_is_run_once_for_its_flops_and_its_peak(flops, memory):
    """measure_model counts a step's FLOPs and tracks its peak in one pass where both are on the
    same kind of tensors (one training step and one inference pass, not two of each), and the
    numbers are those of the separate measurements."""
    model, inputs = attention(), make_inputs("mask")
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, out: calls.append(type(out).__name__), with_kwargs=True)
    result = counting.measure_model(model, inputs, loss_fn, batch_size=B, flops=flops, memory=memory)
    fake = {"flops": flops == "meta", "memory": memory == "fake"}
    assert sorted(calls) == sorted(["FakeTensor" if fake["flops"] or fake["memory"] else "Tensor"] * 2
                                   + (["Tensor"] * 2 if fake["flops"] != fake["memory"] else [])), calls
    assert result["flops_forward"] * B == counting.flops_forward(model, inputs, meta=fake["flops"])
    assert result["flops_train_step"] * B == counting.flops_train_step(model, inputs, loss_fn, meta=fake["flops"])
    assert result["peak_mem_train_bytes"] == counting.peak_memory_train_step(model, inputs, loss_fn, meta=fake["memory"])
    assert result["peak_mem_infer_bytes"] == counting.peak_memory_inference(model, inputs, meta=fake["memory"])


def test_nothing_runs_on_real_tensors_for_a_step_over_the_budget():
    """The budget is checked on fake tensors before any real pass, real FLOPs included."""
    model, inputs = attention(), make_inputs("mask")
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, out: calls.append(type(out).__name__), with_kwargs=True)
    measured = {}
    with pytest.raises(counting.PredictedOOM, match="tracked training peak"):
        counting.measure_model(model, inputs, loss_fn, batch_size=B, flops="real", memory="real", budget_bytes=1000,
                               into=measured)
    assert calls == ["FakeTensor"] and "flops_forward" not in measured and measured["params"] > 0


def test_a_run_and_profile_measure_the_same_objective_ksvd_term_included(uea_fixture, single_thread):
    """One objective, one measurement path: a Primal model's training-step FLOPs and peak memory are
    those of task loss + eta x KSVD, and the run's measurement equals `attnbench profile`'s on the
    same batch."""
    from bench_cli.config.compose import compose
    from bench_cli.engine.objective import Objective
    from bench_cli.commands.profile import harness
    from bench_cli.config.taskfit import build_task
    from bench_cli.engine.measure import example_batch
    from bench_cli.engine.measure import measure_run as run_measure

    cfg = compose(["task.dataset=Fixture", "model=primalformer", "task.backbone.d_model=16", "task.backbone.n_heads=2",
                   "task.backbone.n_layers=1", "task.backbone.d_ff=16", "model.attention.low_rank=2",
                   "trainer.batch_size=4"])
    task = build_task(cfg)
    task.setup("holdout")
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    objective = Objective.of(task, cfg.model)
    assert objective.eta > 0
    ran = run_measure(task, model, cfg, torch.device("cpu"), objective)
    batch = example_batch(task, "train", 4, torch.device("cpu"))
    side = harness.Side("model", cfg.model, harness.Budget(None))
    side.module, side.inputs, side.loss_fn = model, task.model_inputs(batch), objective.on(model, batch)
    harness.measure_static(side, 4, "real", "real", torch.device("cpu"), None)
    for key in ("params", "flops_forward", "flops_train_step", "peak_mem_train_bytes", "peak_mem_infer_bytes"):
        assert ran[key] == side.metrics[key], key
    # what both measured is the objective with the KSVD term (not the task loss alone)
    out = model(**task.model_inputs(batch))
    assert objective.on(model, batch)(out) != task.loss(out, batch)
