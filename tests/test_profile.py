"""`attnbench profile`: counted FLOPs against analytic counts, scaling in N, the CPU memory
tracker, OOM/timeout points, the CSV, the papers' reproduction targets (cheap parts)."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from bench_cli.commands.profile import config, grid, harness
from bench_cli.commands.reproduce import pba
from bench_cli.commands.cli import main

# A tiny UEA model (synthetic shapes: 12 channels, 9 classes; no data read).
TINY = ["task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1", "task.backbone.d_ff=32",
        "task.backbone.dropout=0.0", "trainer.progress=false", "profile.timing.warmup=0", "profile.timing.repeats=1",
        "profile.timing.budget_s=0", "profile.plot=null"]
# Switch off what a test does not look at (the tracker and fake tensors cost ~0.5 s per call).
NO_FLOPS = ["profile.flops=off"]
NO_MEMORY = ["profile.memory=off", "profile.memory_budget_gb=null"]


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_profile(*args: str) -> None:
    main(["profile", *TINY, *args])


def fail_line(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(["profile", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --------------------------------------------------------------------------- FLOPs of one layer


@pytest.mark.parametrize("meta", [False, True])
def test_softmax_layer_flops_equal_the_analytic_count(meta):
    B, N, D, H = 2, 64, 32, 4
    d = D // H
    m = harness.profile_layer("softmax", B, N, D, H, meta=meta)
    projections = 4 * 2 * B * N * D * D  # q, k, v, out: (B*N, D) x (D, D)
    assert m["flops_forward"] == projections + 4 * B * H * N * N * d  # + QK^T and AV
    # Training step (input requires grad): 3 matmuls per projection; fused SDPA backward 10*B*H*N^2*d.
    assert m["flops_train_step"] == 3 * projections + (4 + 10) * B * H * N * N * d
    assert m["params"] == 4 * (D * D + D)


# The matmuls of one self-attention layer of papers/002 (Sec. 3), read off its definitions: which
# projections each variant keeps (Def. 1-4) and what each head multiplies. (count, m, k, n) = count
# products of an (m x k) by a (k x n) matrix, 2 m k n FLOPs each (FlopCounterMode's convention).
PBA_PROJECTIONS = {  # Def. 1: W^Q, W^K, W^V, W^O; Def. 2 drops W^V; Def. 3 and 4 drop W^V and W^K
    "standard": ("W^Q", "W^K", "W^V", "W^O"), "optimised": ("W^Q", "W^K", "W^O"),
    "efficient": ("W^Q", "W^O"), "super": ("W^Q", "W^O")}


def pba_layer_matmuls(variant, B, N, D, H, *, train, backend):
    d_k = D // H
    projection = (B * N, D, D)  # X W over all tokens of the batch
    scores, mix = (N, d_k, N), (N, N, d_k)  # Q_i K_i^T and S_i V_i, per sequence and head
    forward = [(1, *projection) for _ in PBA_PROJECTIONS[variant]] + [(B * H, *scores), (B * H, *mix)]
    if variant == "super":
        forward.append((B * H, N, N, d_k))  # W^A V_i (Eqn. 22)
    if not train:
        return forward
    # Backward (the layer input requires grad, as inside a network): a projection's input and weight
    # gradients are two more products of its size; W^A V_i likewise (grads of V_i and of W^A).
    backward = [(2 * c, m, k, n) for c, m, k, n in forward if (m, k, n) == projection]
    if variant == "super":
        backward.append((2 * B * H, N, N, d_k))
    if backend == "math":  # autograd of the two matmuls: dQ, dK from dS; dS, dV from dO
        backward += [(2 * B * H, *scores), (2 * B * H, *mix)]
    else:  # the fused kernel recomputes the scores: QK^T, dO V^T, P^T dO, dS K, dS^T Q
        backward += [(B * H, *scores), (2 * B * H, *mix), (2 * B * H, *scores)]
    return forward + backward


def flops_of(matmuls):
    return sum(2 * c * m * k * n for c, m, k, n in matmuls)


@pytest.mark.parametrize("variant", ["standard", "optimised", "efficient", "super"])
@pytest.mark.parametrize("backend", ["auto", "math"])
@pytest.mark.parametrize("B,N,D,H", [(1, 32, 64, 2), (2, 12, 24, 3)])
def test_pba_layer_flops_equal_the_papers_matmuls(variant, backend, B, N, D, H):
    m = harness.profile_layer(variant, B, N, D, H, backend=backend)
    assert m["flops_forward"] == flops_of(pba_layer_matmuls(variant, B, N, D, H, train=False, backend=backend))
    assert m["flops_train_step"] == flops_of(pba_layer_matmuls(variant, B, N, D, H, train=True, backend=backend))
    # the profile command's own analytic count (bench_cli.commands.reproduce.pba) says the same
    assert m["flops_forward"] == pba.analytic_layer_flops(variant, B, N, D, train=False, backend=backend)
    assert m["flops_train_step"] == pba.analytic_layer_flops(variant, B, N, D, train=True, backend=backend)


def test_eqn24_is_the_papers_formula():
    c = {"standard": 15, "optimised": 12, "efficient": 9, "super": 12, "head_term": 15}
    assert pba.eqn24_flops("standard", 64, 128, 1, c) == 15 * 64 * 128 + 15 * 64 * 64
    assert pba.eqn24_flops("efficient", 64, 128, 8, c) == 9 * 64 * 128 + 15 * 8 * 64 * 64
    # Figure 3's "up to 67% more": the ratio tends to 15/9 as d_m >> l.
    assert pba.eqn24_flops("standard", 1, 10**6, 1, c) / pba.eqn24_flops("efficient", 1, 10**6, 1, c) == pytest.approx(15 / 9, rel=1e-5)


@pytest.mark.parametrize("attention", ["linear", "primal", "softmax"])
def test_flops_grow_linearly_in_n_but_softmax_quadratically(attention):
    f1, f2, f4 = (harness.profile_layer(attention, 1, n, 32, 2) for n in (256, 512, 1024))
    for key in ("flops_forward", "flops_train_step"):
        if attention == "softmax":  # quadratic, for contrast: the affine check below fails on it
            assert f4[key] - f2[key] > 2 * (f2[key] - f1[key]), key
        else:  # primal samples min(200, N) rows: affine in N
            assert f4[key] - f2[key] == 2 * (f2[key] - f1[key]), key


# --------------------------------------------------------------------------- the task grid


def test_profile_csv_columns_and_ratios(workdir):
    # No figure here: a measured profile's is drawn by test_an_overridden_attention_names_the_rows_title_and_figure,
    # a named profile.plot path by tests/test_figures.py's replots (the same render.plot_paths), each 1-2 s of CPU.
    run_profile("model=attention_sh", "baseline=softmax", "profile.seq_lens=[8]", "profile.d_models=[16,32]",
                "profile.output=prof.csv", "profile.timing.repeats=3")  # 3 rounds: quartiles
    rows = read_csv(workdir / "prof.csv")
    assert list(rows[0])[: len(grid.PROFILE_COLUMNS)] == grid.PROFILE_COLUMNS
    assert [(r["d_model"], r["seq_len"]) for r in rows] == [("16", "8"), ("32", "8")]
    for r in rows:
        assert r["status"] == "ok" and r["model"] == "attention_sh" and r["baseline"] == "softmax"
        assert r["device"] == "cpu" and r["sdpa_backend"] == "auto" and r["task"] == "uea"
        for m in ("params", "flops_forward", "flops_train_step", "peak_mem_train_bytes", "peak_mem_infer_bytes",
                  "time_train_s", "time_infer_s"):
            model, base, ratio = float(r[f"model_{m}"]), float(r[f"baseline_{m}"]), float(r[f"ratio_{m}"])
            # a time's ratio is the median of the rounds' ratios, not the ratio of the medians
            assert model > 0 and base > 0 and (m in grid.TIMED or ratio == pytest.approx(model / base)), m
        assert float(r["model_flops_train_step"]) > 2 * float(r["model_flops_forward"])
        assert float(r["reduction_pct_flops_forward"]) == pytest.approx(100 * (1 - float(r["ratio_flops_forward"])))
        assert r["git_commit"] and r["torch_version"] and "profile.seq_lens=[8]" in r["command"]
        assert r["flops_method"] == "FlopCounterMode on fake tensors" and r["timing_method"].startswith("warmup=0")
        for m in grid.TIMED:  # the ratio's interval and each side's
            assert float(r[f"ratio_{m}_q1"]) <= float(r[f"ratio_{m}"]) <= float(r[f"ratio_{m}_q3"]), m
            assert float(r[f"model_{m}_q1"]) <= float(r[f"model_{m}"]) <= float(r[f"model_{m}_q3"]), m
        tokens = int(r["batch_size"]) * int(r["seq_len"])
        assert float(r["model_tokens_per_s_train"]) == pytest.approx(tokens / float(r["model_time_train_s"]))
        assert float(r["baseline_samples_per_s_infer"]) == pytest.approx(
            int(r["batch_size"]) / float(r["baseline_time_infer_s"]))
        assert r["load_before"] != "" and int(r["threads"]) >= 1 and "timing_noisy" in r
    assert rows[1]["n_heads"] == "2" and int(rows[1]["model_params"]) > int(rows[0]["model_params"])
    # append: a second run adds rows; append=false starts afresh
    quick = ["profile.seq_lens=[8]", "profile.output=prof.csv", "profile.timing.enabled=false", *NO_FLOPS, *NO_MEMORY]
    run_profile(*quick)
    rows = read_csv(workdir / "prof.csv")
    assert len(rows) == 3 and rows[-1]["model"] == "softmax" and rows[-1]["model_time_train_s"] == ""
    assert rows[-1]["model_params"] != "" and rows[-1]["model_flops_forward"] == ""
    run_profile(*quick, "profile.append=false")
    assert len(read_csv(workdir / "prof.csv")) == 1


def test_softmax_memory_grows_faster_than_linearly_on_the_cpu_tracker(workdir):
    run_profile("baseline=null", "profile.seq_lens=[32,64,128]", "profile.sdpa_backends=[math,auto]",
                "profile.timing.enabled=false", "profile.output=mem.csv", *NO_FLOPS)
    rows = read_csv(workdir / "mem.csv")
    for backend in ("math", "auto"):
        for kind in ("train", "infer"):
            m1, m2, m4 = (int(r[f"model_peak_mem_{kind}_bytes"]) for r in rows if r["sdpa_backend"] == backend)
            if backend == "math":  # N x N scores materialised: quadratic growth
                assert m4 - m2 > 2 * (m2 - m1) and m4 > 2.5 * m2, (kind, m1, m2, m4)
            else:  # the fused CPU flash kernel keeps no N x N tensor: the tracker sees about linear growth
                assert m4 < 2.3 * m2, (kind, m1, m2, m4)
    assert rows[0]["memory_method"].startswith("MemTracker on fake tensors")


def test_fake_tensor_memory_equals_real_tensor_memory_on_the_cpu(workdir):
    for mode in ("fake", "real"):
        run_profile("model=attention_bn_sh", "baseline=null", "profile.seq_lens=[32]", "profile.sdpa_backends=[math]",
                    f"profile.memory={mode}", "profile.memory_budget_gb=null", "profile.timing.enabled=false",
                    f"profile.output={mode}.csv", *NO_FLOPS)
    fake, real = read_csv(workdir / "fake.csv")[0], read_csv(workdir / "real.csv")[0]
    assert "real tensors" in real["memory_method"] and "fake tensors" in fake["memory_method"]
    for k in ("model_peak_mem_train_bytes", "model_peak_mem_infer_bytes"):
        assert int(fake[k]) > 0 and fake[k] == real[k], k
    assert fake["model_flops_forward"] == ""  # profile.flops=off


def test_forced_oom_point_is_recorded_and_the_grid_goes_on(workdir):
    # 256 KiB, between the points' tracked training peaks: about 5x that at N = 16 (49 KB: 5 K parameters)
    # and 1/8 of that at N = 256 (2 MB: the math backend's N x N scores), so a budget read in the wrong
    # unit or compared with another peak fails here, without a profile run first to measure the peaks.
    common = ["baseline=null", "profile.sdpa_backends=[math]", "profile.memory=off", *NO_FLOPS]
    run_profile(*common, f"profile.memory_budget_gb={2**-12}", "profile.seq_lens=[8,256,16]", "profile.output=oom.csv")
    rows = read_csv(workdir / "oom.csv")
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"]  # recorded, skipped, and the grid went on
    oom = rows[1]
    assert oom["model_status"] == "oom" and "memory_budget_gb" in oom["error"]
    assert oom["model_params"] != "" and oom["model_time_train_s"] == ""
    assert rows[0]["model_time_train_s"] != "" and rows[2]["model_time_train_s"] != ""


def test_forced_timeout_point_is_recorded_and_the_grid_goes_on(workdir, monkeypatch):
    from bench_cli.commands.profile import steps

    real_step = steps.train_step

    def slow_step(side):
        if next(iter(side.inputs.values())).shape[1] == 16:
            time.sleep(30)
        real_step(side)

    monkeypatch.setattr(steps, "train_step", slow_step)
    started = time.perf_counter()
    run_profile("profile.seq_lens=[8,16,12]", "profile.timeout_s=1", "profile.output=t.csv", *NO_FLOPS, *NO_MEMORY)
    assert time.perf_counter() - started < 20  # the sleeping steps (model and baseline) were interrupted
    rows = read_csv(workdir / "t.csv")
    assert [r["status"] for r in rows] == ["ok", "timeout", "ok"]
    timed_out = rows[1]
    assert timed_out["model_status"] == "timeout" and "timeout_s" in timed_out["model_error"]
    assert timed_out["baseline_status"] == "timeout" and timed_out["model_time_train_s"] == ""
    assert timed_out["model_params"] != "" and timed_out["ratio_params"] != ""  # what was measured is kept
    assert rows[2]["model_time_train_s"] != ""


def test_failed_side_is_recorded(workdir, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(harness, "measure_static", broken)
    run_profile("profile.seq_lens=[8]", "profile.output=f.csv")
    (row,) = read_csv(workdir / "f.csv")
    assert row["status"] == "failed" and "kaboom" in row["error"] and row["model_time_train_s"] == ""


# --------------------------------------------------------------------------- CLI and config


def test_user_mistakes_are_one_line(workdir, capsys):
    assert "unknown baseline model 'sofmax' (did you mean 'softmax'?)" in fail_line(capsys, "baseline=sofmax")
    assert "unknown profile 'figur1'" in fail_line(capsys, "profile=figur1")
    assert "profile.seq_lens" in fail_line(capsys, "profile.seq_lens=[0,8]")
    assert "unknown profile.sdpa_backends entry 'fast'" in fail_line(capsys, "profile.sdpa_backends=[fast]")
    assert "unknown model" in fail_line(capsys, "model=nope")
    assert "unknown config key 'profile.seqlens'" in fail_line(capsys, "profile.seqlens=[8]")
    assert "not divisible" in fail_line(capsys, "task.backbone.n_heads=8", "profile.d_models=[12]")


@pytest.mark.parametrize("preset", ["default", "figure1", "figure2", "figure3", "figure4", "pba"])
def test_presets_compose(preset):
    cfg = config.load_config([f"profile={preset}"])
    assert cfg.profile.mode == ("pba" if preset == "pba" else "task")
    if preset.startswith("figure"):
        assert cfg.task.name == "lra_retrieval" and cfg.task.backbone.d_model == 64 and cfg.task.backbone.n_heads == 2
        assert cfg.profile.output == f"results/reproduced/{preset}.csv" and 4096 in cfg.profile.seq_lens
    # command-line choices win over a preset's
    assert config.load_config([f"profile={preset}", "model=linear"]).model.name == "linear"


def test_title_names_the_command_once_and_rows_share_the_run_folders_id(workdir, capsys):
    from bench_cli.commands.profile import render

    assert render.title(config.load_config([]), "cpu") == "profile: softmax vs softmax on uea (cpu, float32)"
    assert render.title(config.load_config(["profile=figure1"]), "cpu").startswith("profile figure1: attention_bn_sh vs")
    run_profile("profile.seq_lens=[8]", "profile.output=t.csv", "profile.timing.enabled=false", *NO_FLOPS, *NO_MEMORY)
    assert "profile: softmax vs softmax on uea (cpu, float32)" in capsys.readouterr().out
    (row,) = read_csv(workdir / "t.csv")
    (folder,) = (workdir / "outputs" / "profile").glob("*/*")
    assert folder.name == row["run_id"] and (folder / "config.yaml").is_file()


def test_training_runs_do_not_carry_profile_keys():
    from bench_cli.config.compose import compose

    cfg = compose([])
    assert "profile" not in cfg and "baseline" not in cfg


# --------------------------------------------------------------------------- reproduction targets (cheap parts)


def test_figure1_standard_point_flops_reduction():
    """Primal-dual Sec. 4: BN+SH saves "almost 25%" of the FLOPs at D=64, N=4096 (LRA retrieval).
    The counted ratio is 0.761: attention matmuls x 3/4, k/v projections x 3/4, the FFN unchanged."""
    from bench_cli.config.taskfit import build_task

    # No memory budget: its tracked training pass (about 40% of this test's CPU) measures nothing asked here.
    cfg = config.load_config(["profile=figure1", "profile.seq_lens=[4096]", "profile.d_models=null",
                         "profile.sdpa_backends=[auto]", "profile.timing.enabled=false", "profile.memory=off",
                         "profile.memory_budget_gb=null"])
    rows = grid.run_profile(cfg)
    (row,) = rows
    assert row["status"] == "ok" and row["d_model"] == 64 and row["seq_len"] == 4096
    n, d, f = 4096, 64, 128
    per_token = lambda proj, attn: proj * d * d + 4 * d * f + attn * n * d  # noqa: E731  (per layer, per document)
    analytic = per_token(7, 3) / per_token(8, 4)
    assert row["ratio_flops_forward"] == pytest.approx(analytic, abs=1e-3) == pytest.approx(0.761, abs=1e-3)
    assert 23.0 < row["reduction_pct_flops_train_step"] < 26.0
    assert row["paper_reduction_pct_flops_train_step"] == 25
    assert build_task(cfg).name == "lra_retrieval"


def test_pba_parameter_counts_match_every_table_row():
    cfg = config.load_config(["profile=pba"])
    root = Path(__file__).resolve().parents[1]
    candidates = [root / "results" / "paper" / "pay_better_attention.csv",
                  root.parent / "shared" / "reference" / "pay_better_attention.csv"]
    reference = next((c for c in candidates if c.is_file()), candidates[0])
    rows = pba.pba_params_rows(cfg.profile.params_tables, str(reference) if reference.is_file() else None)
    assert len(rows) == 85 and all(r["match"] for r in rows), [r for r in rows if not r["match"]]
    exact = [r for r in rows if r["printed_resolution"] == 1]
    assert len(exact) == 69 and all(r["ours"] == r["printed_value"] for r in exact)
    if reference.is_file():
        assert all(r["reference_csv_agrees"] for r in rows if "reference_csv_agrees" in r)
        assert "all 84" in pba.reference_coverage(rows, str(reference))


def test_profile_runs_on_a_task_with_encoder_and_decoder_stacks(workdir):
    """Translation has n_encoder_layers + n_decoder_layers, no n_layers: the row counts both."""
    main(["profile", "task=nmt", "model=efficient", "task.backbone.d_model=16", "task.backbone.d_ff=32",
          "task.vocab_size=32", "task.backbone.n_heads=2", "profile.timing.warmup=0", "profile.timing.repeats=1",
          "profile.timing.budget_s=0", "profile.plot=null", *NO_MEMORY, "trainer.progress=false", "profile.seq_lens=[8]",
          "profile.output=prof.csv"])
    rows = read_csv(workdir / "prof.csv")
    assert rows and {r["status"] for r in rows} == {"ok"} and {r["n_layers"] for r in rows} == {"3"}


# --------------------------------------------------------------------------- several models and tasks, a paper's table


def test_several_models_and_tasks_share_the_baseline_and_get_the_papers_ratios(workdir, monkeypatch):
    import torch

    (workdir / "paper.csv").write_text(
        "table,dataset,model,metric,value\n7,Seq,trans,sec,200\n7,Seq,lin,sec,50\n7,Seq,trans,gb,8\n7,Seq,lin,gb,2\n"
        "7,Ops,trans,sec,100\n7,Ops,lin,sec,80\n8,Seq,lin,sec,1\n")
    paper = ("profile.paper={csv:paper.csv,table:7,baseline:trans,models:{linear:lin},datasets:{uea:Seq,lra_listops:Ops},"
             "metrics:{time_per_1k_steps_s:sec,peak_mem_train_bytes:gb},source:tiny}")
    from bench_cli.commands.profile import steps

    optimisers, real_step = [], steps.train_step
    monkeypatch.setattr(steps, "train_step", lambda side: (optimisers.append(side.optimizer), real_step(side)))
    # uea's entry switches the memory measurement off (a profile key of its own, as seq_lens): its six
    # tracked passes would cost 0.7 s of CPU, and lra_listops' rows have their peaks.
    run_profile("profile.models=[linear,attention_sh]", "profile.timing.eval_batches_per_1k_steps=7",
                "profile.timing.optimizer=true",
                "profile.tasks=[{task:uea,seq_lens:[8],memory:off,memory_budget_gb:null},{task:lra_listops,seq_lens:[16],batch_size:2}]",
                paper, "profile.report=eff.md", "profile.output=eff.csv", *NO_FLOPS)
    rows = read_csv(workdir / "eff.csv")
    assert [(r["task"], r["model"], r["seq_len"], r["batch_size"]) for r in rows] == [
        ("uea", "linear", "8", "1"), ("uea", "attention_sh", "8", "1"),
        ("lra_listops", "linear", "16", "2"), ("lra_listops", "attention_sh", "16", "2")]
    for a, b in (rows[:2], rows[2:]):  # the baseline is measured once per point and shared by its rows
        for m in ("params", "peak_mem_train_bytes", "time_train_s", "time_per_1k_steps_s"):
            assert a[f"baseline_{m}"] == b[f"baseline_{m}"], m
            assert (a[f"baseline_{m}"] == "") is (m == "peak_mem_train_bytes" and a["task"] == "uea"), m  # memory=off there
    for r in rows:
        assert r["status"] == "ok" and r["baseline"] == "softmax"
        assert f"train step with {'adamw' if r['task'] == 'lra_listops' else 'radam'} step" in r["timing_method"]
        assert float(r["model_time_per_1k_steps_s"]) == pytest.approx(
            1000 * float(r["model_time_train_s"]) + 7 * float(r["model_time_infer_s"]))
        assert float(r["ratio_time_per_1k_steps_s"]) == pytest.approx(
            float(r["model_time_per_1k_steps_s"]) / float(r["baseline_time_per_1k_steps_s"]))
        assert f"task={r['task']}" in r["command"] and "profile.tasks=null" in r["command"]  # reruns its task alone
    # the timed train steps took the run's optimiser step (the LRA trainer's AdamW, eps 1e-6)
    assert optimisers and all(o is not None for o in optimisers)
    assert any(isinstance(o, torch.optim.AdamW) and o.defaults["eps"] == 1e-6 for o in optimisers)
    # paper ratios: model / baseline from the printed values of table 7 only; none for an unmapped model or metric
    assert float(rows[0]["paper_ratio_time_per_1k_steps_s"]) == 0.25 and float(rows[0]["paper_ratio_peak_mem_train_bytes"]) == 0.25
    assert rows[0]["paper_source"] == "tiny" and rows[1]["paper_ratio_time_per_1k_steps_s"] == ""
    assert float(rows[2]["paper_ratio_time_per_1k_steps_s"]) == 0.8 and rows[2]["paper_ratio_peak_mem_train_bytes"] == ""
    md = (workdir / "eff.md").read_text()
    assert "## Seq (`uea`): N = 8, batch 1" in md and "## Ops (`lra_listops`): N = 16, batch 2" in md
    linear_seq = next(line for line in md.splitlines() if line.startswith("| linear |"))
    assert "| 0.25 (4.0x) | " in linear_seq and linear_seq.count("0.25 (4.0x)") == 2


def test_timed_train_step_takes_the_optimiser_and_scheduler_steps():
    import torch

    from bench_cli.commands.profile.steps import train_step

    module = torch.nn.Linear(3, 1)
    side = harness.Side("model", None, harness.Budget(None), module=module, inputs=torch.ones(2, 3),
                        loss_fn=lambda out: out.sum())
    before = module.weight.detach().clone()
    train_step(side)
    assert torch.equal(module.weight, before) and module.weight.grad is None  # no optimiser: no step; grads freed
    side.optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    side.scheduler = torch.optim.lr_scheduler.OneCycleLR(side.optimizer, max_lr=0.1, total_steps=3)
    lrs = []
    for _ in range(4):  # the scheduler steps with the optimiser, and stops at its last step (OneCycleLR would raise)
        train_step(side)
        lrs.append(side.optimizer.param_groups[0]["lr"])
    assert len(set(lrs[:2])) == 2 and lrs[-1] == lrs[-2]
    assert not torch.allclose(module.weight, before) and module.weight.grad is None


def test_primal_lra_efficiency_preset_covers_table4(monkeypatch):
    from omegaconf import OmegaConf

    from bench_cli.config import compose as composition
    from bench_cli.commands.profile.paper_table import PaperRatios

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # profile.paper.csv is relative to the repository
    cfg = config.load_config(["profile=primal_lra_efficiency"])
    p = cfg.profile
    assert cfg.baseline == "softmax" and list(p.sdpa_backends) == ["math"] and p.timing.optimizer is True
    assert cfg.task.backbone.dropout == 0.1 and cfg.primal_options.ksvd_form == "code"  # the LRA experiment's setup
    tasks = {e.task: e for e in p.tasks}
    assert sorted(tasks) == ["lra_image", "lra_listops", "lra_pathfinder", "lra_retrieval", "lra_text"]
    for name, entry in tasks.items():  # every task at its full LRA length
        assert list(entry.seq_lens) == [int(OmegaConf.load(composition.option_file("task", name)).seq_len)], name
    paper = PaperRatios.of(p.paper)
    for name in tasks:
        for model in p.models:
            for metric in p.paper.metrics:
                assert paper.ratio(name, model, metric) is not None, (name, model, metric)
    assert paper.ratio("lra_text", "primalformer", "time_per_1k_steps_s") == pytest.approx(93.6 / 694.8)
    assert paper.ratio("lra_listops", "nystromformer", "peak_mem_train_bytes") == pytest.approx(0.89 / 5.50)


def test_several_models_and_paper_mistakes_are_one_line(workdir, capsys):
    assert "unknown profile.models entry 'linea'" in fail_line(capsys, "profile.models=[linea]")
    assert "plot=auto" in fail_line(capsys, "profile.models=[linear,softmax]", "profile.plot=p.png")
    assert "profile.tasks entry's task" in fail_line(capsys, "profile.tasks=[{task:nope}]")
    assert "eval_batches_per_1k_steps" in fail_line(capsys, "profile.timing.eval_batches_per_1k_steps=-1")
    bad_metric = "profile.paper={csv:x.csv,table:4,baseline:t,models:{},datasets:{a:b},metrics:{flops:x}}"
    assert "profile.paper.metrics" in fail_line(capsys, bad_metric)


def test_a_point_timed_under_a_high_load_is_flagged_noisy(workdir, capsys, monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    run_profile("profile.seq_lens=[8]", "profile.output=prof.csv", *NO_FLOPS, *NO_MEMORY)
    (row,) = read_csv(workdir / "prof.csv")
    assert row["timing_noisy"].startswith("noisy: rerun on an idle machine") and row["load_before"] == "40.0"
    out = " ".join(capsys.readouterr().out.split())
    assert "noisy: rerun on an idle machine" in out and "load 40.0" in out



def test_an_overridden_attention_names_the_rows_title_and_figure(workdir, capsys):
    """``model=softmax model.attention.name=linear`` runs linear attention: nothing may say softmax / softmax
    (a plugin's attention: tests/test_plugins.py)."""
    from bench_cli.commands.profile import render

    overridden = config.load_config(["model.attention.name=linear", "baseline=softmax"])
    assert render.title(overridden, "cpu") == "profile: linear vs softmax on uea (cpu, float32)"
    assert render.figure_titles(overridden, "linear", [])[0].startswith("linear / softmax")
    run_profile("model.attention.name=linear", "baseline=softmax", "profile.seq_lens=[8]", "profile.output=o.csv",
                "profile.plot=auto", "profile.timing.enabled=false", *NO_FLOPS, *NO_MEMORY)
    out = " ".join(capsys.readouterr().out.split())
    (row,) = read_csv(workdir / "o.csv")
    assert row["model"] == row["attention"] == "linear" and row["baseline"] == "softmax"
    assert "profile: linear vs softmax on uea (cpu, float32)" in out
    assert [p.name for p in workdir.glob("*.png")] == ["o_uea_linear_vs_softmax.png"]
    assert (workdir / "o_uea_linear_vs_softmax.png").stat().st_size > 10_000  # the figure of a measured profile
