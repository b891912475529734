"""`attnbench bench --against-reference`: each efficient-attention baseline against the transcription
of its reference code (models/attention/reference/), on the same weights and inputs.

For each N and variant: our module is built as the ListOps layer builds it (--d-model 64, --heads 2,
the options of conf/model/<name>.yaml at task lra_listops, attention dropout 0 so both sides do the
same work) and the reference transcription reads that module's weights; the input is a batch of
random tokens whose second row is right-padded by a quarter, with its mask. A step is forward +
backward (the output summed, gradients for the input and every weight), float32. After a 16 MB
block is allocated and freed (PRIMING_BYTES) and one warm-up of each, the two are timed in at least
--repeats pairs (more, up to --budget seconds per variant and N, until the pair ratios' IQR is
within 5% of their median), the order alternating from pair to pair (ours first, then the
reference first), and each pair gives one ratio ours / reference (< 1: ours is faster). The table shows the median times, the median ratio and the interquartile range
of the pair ratios; under it, per N, the geometric mean of the median ratios, and the load
average before and after with the thread count, and "noisy: rerun on an idle machine" when
the load exceeded the cores or a ratio's IQR exceeds 10% of it. Before timing, each pair of outputs is compared
(a line says so if they differ by more than float32 rounding).

Reformer and Longformer are timed against the reference package itself, HuggingFace transformers'
``LSHSelfAttention`` and ``LongformerSelfAttention``, built and tied to our module's weights as the
LRA wrappers do (mlpen/Nystromformer attention_reformer.py, mlpen/YOSO attention_longformer.py),
when transformers is installed (the bench extra); else n/a: their transcriptions, written one
query at a time to check outputs, are no measure of speed. The LRA code ran transformers 3.x,
which no longer installs next to torch 2.x; the 4.x/5.x modules compute the same thing (our
outputs match them to float32 rounding, the comparison above, and tests/test_bench_reference.py).
Reformer's random rotations are drawn from the global RNG by both (hash_seed None), so the
comparison seeds it identically before each side.
"""
from __future__ import annotations

import math

VARIANTS = ("linformer", "reformer", "longformer", "performer", "nystromformer", "yoso_e", "cosformer", "soft",
            "flowformer")


def layer_options(name: str, n: int) -> dict:
    """Options beyond the presets' defaults that the ListOps layer of ``name`` gets at length n."""
    sized = {"max_len": n} if name in ("linformer", "soft") else {}  # the task's length
    per_variant = {
        "yoso_e": {"hash_code_len": 11},  # primal_attention/lra per_dataset: ListOps
        "flowformer": {"feature_map": "relu", "competition_over": "heads", "padding": "ignore"},  # family lra_listops
    }
    return {"dropout": 0.0, **sized, **per_variant.get(name, {})}


# Variants whose reference is a package (transformers' LSH and sliding-window attentions): their
# transcriptions check outputs one query at a time (Python loops), so without the package they are
# not timed (timing a transcription would measure the interpreter, not the reference).
PACKAGE_REFERENCES = ("reformer", "longformer")
PACKAGE_NOTE = "n/a: {names}: timed against transformers' modules, not installed here ({hint}); " \
               "their transcriptions go one query at a time"


def import_transformers():
    """The transformers package, or None when it is not installed. It imports torchvision when that is
    installed, so torchvision goes through the project's shim first (tasks/vision/torchvision_shim.py)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return None
    if importlib.util.find_spec("torchvision") is not None:
        from attnbench.tasks.vision.torchvision_shim import import_torchvision

        import_torchvision()
    import transformers

    transformers.logging.set_verbosity_error()  # not "config.num_buckets is not set" at every build
    return transformers


def transformers_reformer(module, n: int):
    """f(x, mask): transformers' LSHSelfAttention built as mlpen/Nystromformer LRA/code/attention_reformer.py
    builds it from our ReformerAttention (its query_key and value tied to W_q's and W_v's weights), then W_o."""
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    if n > module.chunk_length and n % module.chunk_length:
        raise ValueError(f"LSHSelfAttention needs N a multiple of the chunk length {module.chunk_length} "
                         "(ReformerModel pads)")
    config = ReformerConfig(
        hidden_size=module.d_model, num_attention_heads=module.n_heads, attention_head_size=module.d_head,
        attn_layers=["lsh"], num_hashes=module.num_hashes, is_decoder=False,
        max_position_embeddings=module.max_len or n, lsh_attn_chunk_length=module.chunk_length,
        num_buckets=module.num_buckets, lsh_num_chunks_before=module.chunks_before,
        lsh_num_chunks_after=module.chunks_after, hash_seed=module.hash_seed,
        lsh_attention_probs_dropout_prob=module.dropout)
    lsh = LSHSelfAttention(config).train(module.training)
    lsh.query_key.weight = module.q_proj.weight
    lsh.value.weight = module.v_proj.weight
    return lambda x, mask: module.out_proj(lsh(x, attention_mask=mask).hidden_states)


def transformers_longformer(module, n: int):
    """f(x, mask): transformers' LongformerSelfAttention built as mlpen/YOSO attention_longformer.py builds
    it from our LongformerAttention (all six projections tied to W_q, W_k, W_v), then W_o. The mask it
    gets is YOSO's: 0 local, -1 padding, 1 global (the first ``global_tokens`` positions); the 3.x
    module derived the index masks from it in its forward, the newer ones take them as arguments."""
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    if n % module.window_size:
        raise ValueError(f"LongformerSelfAttention needs N a multiple of the window {module.window_size} "
                         "(LongformerModel pads)")
    config = LongformerConfig(hidden_size=module.d_model, num_attention_heads=module.n_heads,
                              attention_window=[module.window_size], attention_probs_dropout_prob=module.dropout)
    sliding = LongformerSelfAttention(config, layer_id=0).train(module.training)
    for ours, theirs in ((module.q_proj, "query"), (module.k_proj, "key"), (module.v_proj, "value")):
        for projection in (getattr(sliding, theirs), getattr(sliding, theirs + "_global")):
            projection.weight, projection.bias = ours.weight, ours.bias

    def forward(x, mask):
        attention_mask = mask.to(x.dtype) - 1
        attention_mask[:, :module.global_tokens] = 1
        is_global = attention_mask > 0
        out = sliding(x, attention_mask=attention_mask, is_index_masked=attention_mask < 0,
                      is_index_global_attn=is_global, is_global_attn=bool(is_global.any()))[0]
        return module.out_proj(out)
    return forward


def reference_forward(name: str, module, n: int):
    """f(x, mask) -> output of the reference code of ``name`` on ``module``'s weights: the transcription,
    or for PACKAGE_REFERENCES the package's module (transformers must be importable)."""
    from bench_cli.core.extras import install_hint
    from attnbench.models.attention.reference import cosformer, flowformer, linformer, nystromformer, performer, soft, yoso

    if name in PACKAGE_REFERENCES:
        if import_transformers() is None:
            raise ModuleNotFoundError(f"{name}'s reference is transformers' module: {install_hint('bench')}")
        return {"reformer": transformers_reformer, "longformer": transformers_longformer}[name](module, n)
    code = {
        "linformer": linformer.code_attention,
        "performer": performer.code_attention,
        "nystromformer": nystromformer.code_attention,
        "yoso_e": yoso.code_yoso_e,
        "cosformer": lambda m, x, mask: cosformer.code_cosformer(m, x, False, mask),
        "soft": soft.code_soft,
        "flowformer": lambda m, x, mask: flowformer.code_lra(m, x),  # padding ignore: the code takes no mask
    }[name]
    return lambda x, mask: code(module, x, mask)


def listops_batch(batch: int, n: int, d_model: int):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, n, d_model, generator=g)
    mask = torch.ones(batch, n, dtype=torch.bool)
    if batch > 1:
        mask[1, n - n // 4:] = False  # right padding, as LRA pads a shorter sequence
    return x, mask


def steps(name: str, n: int, args):
    """(ours, reference, max |difference| of the outputs): two forward + backward closures."""
    import torch

    from attnbench.models.attention import build_attention

    torch.manual_seed(0)
    module = build_attention(name, d_model=args.d_model, n_heads=args.heads, **layer_options(name, n)).train()
    x, mask = listops_batch(args.batch, n, args.d_model)
    reference = reference_forward(name, module, n)

    def step(forward):
        def run():
            xg = x.detach().requires_grad_()
            forward(xg).sum().backward()
            module.zero_grad(set_to_none=True)
        return run

    with torch.no_grad():  # the same global RNG state for both: Reformer draws its rotations from it
        ours = seeded(lambda: module(x, mask))
        difference = (ours - seeded(lambda: reference(x, mask)))[mask].abs().max().item()
    return step(lambda xg: module(xg, mask)), step(lambda xg: reference(xg, mask)), difference


def seeded(forward, seed: int = 0):
    """forward() after torch.manual_seed(seed), the global RNG restored afterwards."""
    import torch

    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        return forward()
    finally:
        torch.set_rng_state(state)


# One block this large allocated and freed before each variant: glibc then serves every smaller block
# from its heap and keeps freed memory (its mmap threshold follows the largest freed block, up to
# 32 MB), as in the steady state of a training run. Without it the state depends on what ran before:
# a variant timed after Performer (8 MB blocks) saw its reference 1.5x faster than timed alone.
PRIMING_BYTES = 16 << 20


def prime_allocator() -> None:
    import torch

    block = torch.empty(PRIMING_BYTES, dtype=torch.uint8)
    del block


def time_pairs(ours, theirs, args) -> tuple[list[float], list[float]]:
    """Seconds of alternating pairs (ours first in even pairs), after one warm-up each: at least
    --repeats pairs, more until the ratio is precise or --budget seconds are spent (bench_cli.engine.timing)."""
    from bench_cli.engine.timing import time_rounds, timed

    prime_allocator()
    a, b = time_rounds([timed(ours), timed(theirs)], min_rounds=args.repeats, budget_s=args.budget)
    return a, b


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def run(args) -> list[dict]:
    """Time every chosen variant at every N; print the table; return its rows (dicts)."""
    import torch

    from bench_cli.core.errors import UserError

    names = list(VARIANTS)
    if args.variants:
        unknown = sorted(set(args.variants) - set(VARIANTS))
        if unknown:
            raise UserError(f"no reference transcription for {', '.join(unknown)}; --against-reference "
                            f"times {', '.join(VARIANTS)}")
        names = [v for v in VARIANTS if v in args.variants]
    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _time_and_show(names, args)
    finally:
        torch.set_num_threads(threads_before)


def _time_and_show(names: list[str], args) -> list[dict]:
    from bench_cli.core.extras import install_hint
    from bench_cli.engine.timing import NOISY_NOTE, Spread, TimingSession, ratio_spread
    from bench_cli.core.ui import console, show_table

    session = TimingSession(one_thread="--threads 1")
    rows, results, notes = [], [], []
    untimed = [name for name in names if name in PACKAGE_REFERENCES]
    if untimed and import_transformers() is not None:
        untimed = []
    for n in args.seq_lens:
        for name in names:
            if name in untimed:
                rows.append([name, str(n), "n/a", "n/a", "", "", ""])
                continue
            try:
                ours, theirs, difference = steps(name, n, args)
            except (RuntimeError, ValueError) as e:  # e.g. Nystromformer's code needs N a multiple of its landmarks
                rows.append([name, str(n), "n/a", "n/a", "", "", ""])
                notes.append(f"n/a: {name} at N={n}: {str(e).splitlines()[0]}")
                continue
            if difference > 1e-3:
                notes.append(f"{name} N={n}: outputs differ from the reference by up to {difference:.2g}")
            a, b = time_pairs(ours, theirs, args)
            mine, ref, ratio = Spread.of(a), Spread.of(b), session.judge(ratio_spread(a, b))
            tokens = mine.scaled(args.batch * n)
            result = {"variant": name, "n": n, "ours_s": mine.median, "reference_s": ref.median,
                      "ratio": ratio.median, "q1": ratio.q1, "q3": ratio.q3, "pairs": ratio.n,
                      "ours_tokens_per_s": tokens.median, "max_difference": difference}
            results.append(result)
            rows.append([name, str(n), f"{mine.median * 1e3:.1f}", f"{ref.median * 1e3:.1f}",
                         f"{ratio.median:.2f}", f"{ratio.q1:.2f}-{ratio.q3:.2f}" + (" !" if ratio.noisy else ""),
                         f"{tokens.median:.3g}"])
    noise = session.done().noise
    for r in results:
        r.update(session.columns())
    threads = session.conditions.threads
    show_table(f"vs reference: fwd+bwd float32, batch {args.batch}, >= {args.repeats} pairs, "
               f"{threads} thread{'s' if threads > 1 else ''}" + (f" ({NOISY_NOTE})" if noise else ""),
               ["variant", "N", "ours ms", "ref ms", "ratio", "IQR", "ours tok/s"], rows)
    for n in args.seq_lens:
        ratios = [r["ratio"] for r in results if r["n"] == n]
        if ratios:
            console.print(f"N={n}: geometric mean of the ratios {geometric_mean(ratios):.2f} over {len(ratios)} "
                          "variants", highlight=False)
    console.print("ratio: median of the pairs' ours / reference (< 1: faster); IQR of the pair ratios (! wider "
                  "than 10% of the median); tok/s: tokens of a fwd+bwd step per second", highlight=False)
    console.print(session.line(), highlight=False)
    if noise:
        console.print(f"[red]{noise}[/]", highlight=False)
    for note in ([PACKAGE_NOTE.format(names=", ".join(untimed), hint=install_hint("bench"))] if untimed else []) + notes:
        console.print(note, highlight=False, markup=False)  # "[bench]" is no markup
    return results
