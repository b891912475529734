"""Speed of every registered attention against softmax, measured in the same run.

    PYTHONPATH=. .venv/bin/python -m bench_cli.bench_attention --seq-lens 1024 4096

For each sequence length N and variant: a warm-up, then the median over --repeats of
(a) a forward pass without autograd and (b) a forward + backward pass, the repeats interleaved
round-robin over the variants; the ratio column is the variant's time over softmax's at the
same N (< 1 = faster). On a machine shared with other jobs, --threads 1 gives steadier numbers.
SH variants use the papers' factors for the head count ([1, 2] for 2 heads), super uses
max_len = N, conv2d needs a square N (a 32 x 32 or 64 x 64 patch grid at the defaults) and is
skipped otherwise, and with --causal the variants that cannot be causal are skipped (primal runs
data-independent, Listing 1); lines under the table say why a variant shows n/a.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from models.attention import attention_spec, available_attentions, build_attention
from models.attention.modifiers import default_sh_factors


def variant_options(name: str, n: int, heads: int) -> dict | None:
    """Options to build ``name`` for length n; None if the variant cannot run at this length."""
    if name in ("super", "linformer", "soft"):  # sized by the sequence length (W^A, E, SOFT's landmark window)
        return {"max_len": n}
    if name == "conv2d" and int(n**0.5) ** 2 != n:
        return None
    if name.endswith("_sh"):
        return {"sh_factors": default_sh_factors(heads)}
    return {}


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def skip_reason(name: str, n: int, args) -> str | None:
    """Why ``name`` is not timed at length n (shown under the table), or None."""
    if args.causal and not attention_spec(name).capabilities.causal:
        return "not causal"
    if variant_options(name, n, args.heads) is None:
        return f"needs a square N (a patch grid), N={n}"
    return None


# Said under the table when a variant runs with other options than its preset's.
CAUSAL_NOTES = {"primal": "causal with data_dependent=false (Listing 1: the sampled rows would see the future)"}


def build_runners(name, n, args):
    """(forward, forward_backward) closures for ``name`` at length n, or None if it cannot run."""
    if skip_reason(name, n, args):
        return None
    options = variant_options(name, n, args.heads)
    if args.causal and name == "primal":
        options["data_dependent"] = False
    torch.manual_seed(0)
    module = build_attention(name, d_model=args.d_model, n_heads=args.heads, **options)
    x = torch.randn(args.batch, n, args.d_model)

    def forward():
        with torch.no_grad():
            module(x, causal=args.causal)

    def forward_backward():
        xg = x.detach().requires_grad_()
        module(xg, causal=args.causal).sum().backward()
        module.zero_grad(set_to_none=True)

    return forward, forward_backward


def time_length(names, n, args) -> dict:
    """Median (forward, fwd+bwd) seconds per variant; repeats are interleaved round-robin over
    the variants so that load from other processes hits all of them alike."""
    runners = {name: build_runners(name, n, args) for name in names}
    live = {name: r for name, r in runners.items() if r is not None}
    times = {name: ([], []) for name in live}
    for mode in (0, 1):
        for fns in live.values():  # warm-up
            fns[mode]()
        for _ in range(args.repeats):
            for name, fns in live.items():
                times[name][mode].append(seconds(fns[mode]))
    return {name: (tuple(statistics.median(t) for t in times[name]) if name in live else None) for name in names}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--causal", action="store_true", help="time causal forward passes")
    parser.add_argument("--variants", nargs="+", default=None, help="subset of variants (softmax is always timed)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    return parser.parse_args(argv)


def render(rows, title: str, notes: list[str] = ()) -> None:
    """The table, then one line per note (why a variant shows n/a, options that differ)."""
    headers = ["variant", "N", "forward ms", "x softmax", "fwd+bwd ms", "x softmax"]
    from bench_cli.ui import console, show_table

    show_table(title, headers, rows)  # blocks instead of folded numbers at 80 columns
    for note in notes:
        console.print(note, highlight=False)


def notes_for(names, seq_lens, args) -> list[str]:
    """'n/a: conv2d, linear_bn: not causal' per reason, and the options changed for causal runs."""
    skipped: dict[str, list[str]] = {}
    for name in names:
        for n in seq_lens:
            reason = skip_reason(name, n, args)
            if reason and name not in skipped.setdefault(reason, []):
                skipped[reason].append(name)
    notes = [f"n/a: {', '.join(skipped_names)}: {reason}" for reason, skipped_names in skipped.items() if skipped_names]
    if args.causal:
        notes += [f"{name}: {note}" for name, note in CAUSAL_NOTES.items() if name in names]
    return notes


def main(argv=None) -> list[tuple]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = available_attentions()
    if args.variants:
        unknown = sorted(set(args.variants) - set(names))
        if unknown:
            raise SystemExit(f"unknown variants: {', '.join(unknown)}; valid: {', '.join(names)}")
        names = ["softmax"] + [n for n in names if n in args.variants and n != "softmax"]
    rows, results = [], []
    for n in args.seq_lens:
        timed = time_length(["softmax"] + [v for v in names if v != "softmax"], n, args)
        ref_fwd, ref_bwd = timed["softmax"]
        for name, t in timed.items():
            if t is None:
                rows.append([name, str(n), "n/a", "", "n/a", ""])
                continue
            fwd, bwd = t
            results.append((name, n, fwd, bwd))
            rows.append([
                name, str(n), f"{fwd * 1e3:.1f}", f"{fwd / ref_fwd:.2f}", f"{bwd * 1e3:.1f}", f"{bwd / ref_bwd:.2f}"
            ])
    mode = "causal" if args.causal else "bidirectional"
    render(rows, f"attention speed ({mode}, d_model={args.d_model}, heads={args.heads}, batch={args.batch}, "
                 f"median of {args.repeats}, {torch.get_num_threads()} threads)", notes_for(names, args.seq_lens, args))
    return results


if __name__ == "__main__":
    main()
