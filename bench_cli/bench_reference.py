"""`attnbench bench --against-reference`: each efficient-attention baseline against the transcription
of its reference code (models/attention/reference/), on the same weights and inputs.

For each N and variant: our module is built as the ListOps layer builds it (--d-model 64, --heads 2,
the options of conf/model/<name>.yaml at task lra_listops, attention dropout 0 so both sides do the
same work) and the reference transcription reads that module's weights; the input is a batch of
random tokens whose second row is right-padded by a quarter, with its mask. A step is forward +
backward (the output summed, gradients for the input and every weight), float32. After a 16 MB
block is allocated and freed (PRIMING_BYTES) and one warm-up of each, the two are timed in --repeats pairs, the order alternating from pair to pair
(ours first, then the reference first), and each pair gives one ratio ours / reference (< 1:
ours is faster). The table shows the median times, the median ratio and the interquartile range
of the pair ratios; under it, per N, the geometric mean of the median ratios, and the load
average before and after with the thread count. Before timing, each pair of outputs is compared
(a line says so if they differ by more than float32 rounding). Reformer and Longformer show n/a:
their transcriptions, written one query at a time to check outputs, are no measure of speed.
"""
from __future__ import annotations

import math
import os
import statistics

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


# Variants whose transcription checks outputs one query at a time (Python loops): timing it would
# measure the interpreter, not the reference (transformers' LSH and sliding-window attentions).
LOOP_TRANSCRIPTIONS = ("reformer", "longformer")
LOOP_NOTE = ("n/a: {names}: their transcriptions follow the reference one query at a time (to check outputs, "
             "not to time them), and the reference package (transformers 3.x) is not a dependency")


def reference_forward(name: str):
    """f(module, x, mask) -> output of the reference transcription of ``name``."""
    from models.attention.reference import cosformer, flowformer, linformer, nystromformer, performer, soft, yoso

    return {
        "linformer": linformer.code_attention,
        "performer": performer.code_attention,
        "nystromformer": nystromformer.code_attention,
        "yoso_e": yoso.code_yoso_e,
        "cosformer": lambda m, x, mask: cosformer.code_cosformer(m, x, False, mask),
        "soft": soft.code_soft,
        "flowformer": lambda m, x, mask: flowformer.code_lra(m, x),  # padding ignore: the code takes no mask
    }[name]


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

    from models.attention import build_attention

    torch.manual_seed(0)
    module = build_attention(name, d_model=args.d_model, n_heads=args.heads, **layer_options(name, n)).train()
    x, mask = listops_batch(args.batch, n, args.d_model)
    reference = reference_forward(name)

    def step(forward):
        def run():
            xg = x.detach().requires_grad_()
            forward(xg).sum().backward()
            module.zero_grad(set_to_none=True)
        return run

    with torch.no_grad():
        difference = (module(x, mask) - reference(module, x, mask))[mask].abs().max().item()
    return step(lambda xg: module(xg, mask)), step(lambda xg: reference(module, xg, mask)), difference


# One block this large allocated and freed before each variant: glibc then serves every smaller block
# from its heap and keeps freed memory (its mmap threshold follows the largest freed block, up to
# 32 MB), as in the steady state of a training run. Without it the state depends on what ran before:
# a variant timed after Performer (8 MB blocks) saw its reference 1.5x faster than timed alone.
PRIMING_BYTES = 16 << 20


def prime_allocator() -> None:
    import torch

    block = torch.empty(PRIMING_BYTES, dtype=torch.uint8)
    del block


def time_pairs(ours, theirs, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` alternating pairs (ours first in even pairs), after one warm-up each."""
    from bench_cli.measure import seconds

    prime_allocator()
    ours(), theirs()
    a, b = [], []
    for i in range(repeats):
        if i % 2 == 0:
            a.append(seconds(ours))
            b.append(seconds(theirs))
        else:
            b.append(seconds(theirs))
            a.append(seconds(ours))
    return a, b


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


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
    import torch

    from bench_cli.ui import console, show_table

    load_before = os.getloadavg()
    rows, results, notes = [], [], []
    for n in args.seq_lens:
        for name in names:
            if name in LOOP_TRANSCRIPTIONS:
                rows.append([name, str(n), "n/a", "n/a", "", ""])
                continue
            try:
                ours, theirs, difference = steps(name, n, args)
            except (RuntimeError, ValueError) as e:  # e.g. Nystromformer's code needs N a multiple of its landmarks
                rows.append([name, str(n), "n/a", "n/a", "", ""])
                notes.append(f"n/a: {name} at N={n}: {str(e).splitlines()[0]}")
                continue
            if difference > 1e-3:
                notes.append(f"{name} N={n}: outputs differ from the reference by up to {difference:.2g}")
            a, b = time_pairs(ours, theirs, args.repeats)
            ratios = [x / y for x, y in zip(a, b)]
            q1, q3 = quartiles(ratios)
            result = {"variant": name, "n": n, "ours_s": statistics.median(a), "reference_s": statistics.median(b),
                      "ratio": statistics.median(ratios), "q1": q1, "q3": q3, "max_difference": difference}
            results.append(result)
            rows.append([name, str(n), f"{result['ours_s'] * 1e3:.1f}", f"{result['reference_s'] * 1e3:.1f}",
                         f"{result['ratio']:.2f}", f"{q1:.2f}-{q3:.2f}"])
    load_after = os.getloadavg()
    threads = torch.get_num_threads()
    show_table(f"vs reference: fwd+bwd float32, batch {args.batch}, {args.repeats} pairs, "
               f"{threads} thread{'s' if threads > 1 else ''}",
               ["variant", "N", "ours ms", "ref ms", "ratio", "IQR"], rows)
    for n in args.seq_lens:
        ratios = [r["ratio"] for r in results if r["n"] == n]
        if ratios:
            console.print(f"N={n}: geometric mean of the ratios {geometric_mean(ratios):.2f} over {len(ratios)} "
                          "variants", highlight=False)
    console.print("ratio: median of the pairs' ours / reference (< 1: faster); IQR of the pair ratios",
                  highlight=False)
    console.print(f"load average (1, 5, 15 min) before {' '.join(f'{v:.2f}' for v in load_before)}, "
                  f"after {' '.join(f'{v:.2f}' for v in load_after)}; {os.cpu_count()} cores", highlight=False)
    untimed = [name for name in names if name in LOOP_TRANSCRIPTIONS]
    for note in ([LOOP_NOTE.format(names=", ".join(untimed))] if untimed else []) + notes:
        console.print(note, highlight=False)
    return results
