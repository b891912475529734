"""`attnbench profile`: parameters, FLOPs, peak memory and time of a model next to a baseline.

Two modes (``profile.mode``), both without any dataset:

``task`` (default)
    For every point (sdpa_backend, d_model, seq_len) of the grid, build the task's full model
    (backbone, head, depth from the task config; ``task.backbone.d_model`` swept, keys listed in
    ``profile.scale_with_d_model`` scaled with it) for ``model`` and for ``baseline``, feed both
    the same synthetic batch of the task's shape (``Task.setup_synthetic`` /
    ``Task.synthetic_batch``) and measure, in the same run:

    * parameters, total and per attention layer (``bench_cli.engine.counting``);
    * FLOPs per sample of a forward pass and of a training step (forward + loss + backward),
      counted with FlopCounterMode and the fused-SDPA formulas; with ``profile.flops=meta`` on
      fake tensors (identical counts, no compute, any size);
    * peak memory of a training step and of inference (per batch): the CUDA allocator peak on
      a GPU; on the CPU the deterministic live-tensor tracker (MemTracker), run on fake tensors
      by default (same numbers as on real ones, no compute). The tracker does not see the
      scratch blocks of the fused CPU flash kernel, which never materialises the N x N scores;
      ``profile.sdpa_backends=[math]`` forces the math path that does (the regime of the
      papers' 2021-2022 GPU code). ``rss_train_bytes`` is the growth of the process's peak RSS
      during one real training step (Linux), for comparison;
    * wall time per step: ``warmup`` untimed steps, then ``repeats`` timed steps of model and
      baseline interleaved (so load from other processes hits both alike), median reported;
    * every ratio model/baseline and the reductions in percent, next to the paper's numbers
      given in ``profile.reference``.

    A side (model or baseline) whose tracked training peak exceeds ``profile.memory_budget_gb``
    is recorded as ``oom`` without running it; one that raises an out-of-memory error is
    recorded as ``oom``; one that exceeds ``profile.timeout_s`` (per point and side) as
    ``timeout``; any other error as ``failed``. The measurements made before are kept and the
    grid goes on. Every point is appended to ``profile.output`` as soon as it is measured.

``pba``
    "You Need to Pay Better Attention" (papers/002): the "# Param." columns of its tables from
    the built standard/optimised/efficient/super layers, and counted FLOPs of one forward +
    backward pass of a single attention layer over a (heads, d_model, seq_len) grid next to
    the paper's Eqn. (24), FLOPs = C_Attn * l * d_m + 15 * h * l^2; the data for its
    Figures 2-4. See :mod:`bench_cli.commands.reproduce.pba`.

FLOP conventions (bench_cli.engine.counting): 2 FLOPs per multiply-accumulate of every matmul-like op;
element-wise work (softmax, norms, bias adds, pooling) is not counted. Fused SDPA: forward
4*B*H*N^2*d, backward 10*B*H*N^2*d (torch's convention: the scores are recomputed, 2.5x the
forward); the math path stores the scores and its backward is 8*B*H*N^2*d (2x the forward).

Modules: ``config`` (compose and check the ``profile`` group), ``harness`` (one side at one
point: budgets, OOM/timeout guards, FLOPs and memory, timing; one attention layer), ``grid``
(task mode: the points, model vs baseline, one row per point), ``render`` (the table, the plot's
path and title), ``paper_table`` (a results/paper table as ratios to the baseline next to ours, and
its markdown report), ``command`` (the CLI; ``profile.tasks``: one grid per task). ``profile.models``
measures several models against one baseline, measured once per point. What compares with the papers' printed numbers lives in
:mod:`bench_cli.commands.reproduce`: the papers' reductions placed next to the measured ones, and the
whole ``pba`` mode. The CSV files are written by :func:`bench_cli.results.csv_store.write_rows`.
"""
from bench_cli.commands.profile.command import cmd_profile

__all__ = ["cmd_profile"]
