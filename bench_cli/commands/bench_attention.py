"""Speed of every registered attention against softmax, measured in the same run.

    PYTHONPATH=. .venv/bin/python -m bench_cli.commands.bench_attention --seq-lens 1024 4096

For each sequence length N and variant: a warm-up, then rounds of (a) a forward pass without
autograd and (b) a forward + backward pass, each round running every variant once (the order
reversed from round to round): at least --repeats rounds, more until every ratio's IQR is within
5% of it or --budget seconds are spent. Times are medians; the ratio column is the median of the
rounds' variant / softmax ratios at the same N (< 1 = faster) with their interquartile range, and
tok/s the tokens (batch x N) per second. Under the table: the load average before and after and
the threads, and "noisy: rerun on an idle machine" when the load exceeded the cores or an IQR
exceeds 10% of its median. On a machine shared with other jobs, --threads 1 gives steadier numbers.
SH variants use the papers' factors for the head count ([1, 2] for 2 heads), super uses
max_len = N, conv2d needs a square N (a 32 x 32 or 64 x 64 patch grid at the defaults) and is
skipped otherwise, and with --causal the variants that cannot be causal are skipped (primal runs
data-independent, Listing 1); lines under the table say why a variant shows n/a.
"""
from __future__ import annotations

from types import SimpleNamespace

# torch and the registry are imported where they are used: `attnbench bench --help` answers at once.


def variant_options(name: str, n: int, heads: int) -> dict | None:
    """Options to build ``name`` for length n; None if the variant cannot run at this length."""
    from attnbench.models.attention.modifiers import default_sh_factors

    if name in ("super", "linformer", "soft"):  # sized by the sequence length (W^A, E, SOFT's landmark window)
        return {"max_len": n}
    if name == "conv2d" and int(n**0.5) ** 2 != n:
        return None
    if name.endswith("_sh"):
        return {"sh_factors": default_sh_factors(heads)}
    return {}


def skip_reason(name: str, n: int, args) -> str | None:
    """Why ``name`` is not timed at length n (shown under the table), or None."""
    from attnbench.models.attention import attention_spec

    if args.causal and not attention_spec(name).capabilities.causal:
        return "not causal"
    if variant_options(name, n, args.heads) is None:
        return f"needs a square N (a patch grid), N={n}"
    return None


# Said under the table when a variant runs with other options than its preset's.
CAUSAL_NOTES = {"primal": "causal with data_dependent=false (Listing 1: the sampled rows would see the future)"}


def build_runners(name, n, args):
    """(forward, forward_backward) closures for ``name`` at length n, or None if it cannot run."""
    import torch

    from attnbench.models.attention import build_attention

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
    """Per variant: the (forward, fwd+bwd) seconds of each round, or None when it cannot run. A round
    runs every variant once, the order reversed from round to round, so that load from other
    processes hits all of them alike and each round gives one ratio to softmax (bench_cli.engine.timing)."""
    from bench_cli.engine.timing import time_rounds, timed

    runners = {name: build_runners(name, n, args) for name in names}
    live = {name: r for name, r in runners.items() if r is not None}
    modes = [time_rounds([timed(fns[mode]) for fns in live.values()], min_rounds=args.repeats, budget_s=args.budget)
             for mode in (0, 1)]
    times = {name: (modes[0][i], modes[1][i]) for i, name in enumerate(live)}
    return {name: times.get(name) for name in names}


# --name: (arity for bench_cli.config.args.parse, type, default); "+" takes one or more values.
# A default of None is the mode's: AGAINST_SOFTMAX, or AGAINST_REFERENCE with --against-reference.
BENCH_OPTIONS = {
    "--seq-lens": ("+", int, None),
    "--d-model": (True, int, 64),
    "--heads": (True, int, 2),
    "--batch": (True, int, None),
    "--repeats": (True, int, None),
    "--causal": (False, bool, False),  # time causal forward passes
    "--variants": ("+", str, None),  # subset of variants (softmax is always timed)
    "--threads": (True, int, None),  # torch.set_num_threads
    "--budget": (True, float, None),  # seconds of timing per N and mode (per variant with --against-reference)
    "--against-reference": (False, bool, False),  # the baselines against their reference code (bench_reference.py)
}
AGAINST_SOFTMAX = {"seq_lens": [1024, 4096], "batch": 1, "repeats": 5, "threads": None, "budget": 10.0}
AGAINST_REFERENCE = {"seq_lens": [2048, 4096], "batch": 2, "repeats": 5, "threads": 1, "budget": 3.0}


USAGE = ("usage: attnbench bench [--seq-lens N [N ...]] [--d-model D] [--heads H] [--batch B] [--repeats R] "
         "[--causal] [--variants NAME [NAME ...]] [--threads T] [--budget S]\n"
         "       attnbench bench --against-reference [--seq-lens N [N ...]] [--batch B] [--repeats R] "
         "[--variants NAME [NAME ...]] [--threads T] [--budget S]\n\n" + __doc__.strip() + "\n\nDefaults: --seq-lens 1024 4096 "
         "--batch 1 --repeats 5 --budget 10 (all threads); with --against-reference --seq-lens 2048 4096 --batch 2 "
         "--repeats 5 --threads 1 --budget 3.")


def parse_args(argv=None) -> SimpleNamespace | None:
    """The options as attributes (``args.seq_lens``), parsed by the parser of every command; None
    after printing the usage (-h, --help)."""
    import sys

    from bench_cli.config.args import parse
    from bench_cli.core.errors import UserError

    argv = sys.argv[1:] if argv is None else list(argv)
    p = parse("bench", argv, {**{k: arity for k, (arity, _, _) in BENCH_OPTIONS.items()}, "-h": False, "--help": False})
    if p.get("-h") or p.get("--help"):
        from bench_cli.commands.bench_reference import __doc__ as against_reference  # torch-free at import, as this module

        from bench_cli.core.ui import usage_text


        print(usage_text(USAGE + "\n\n" + against_reference.strip()))
        return None
    extra = p.positional + p.overrides
    if extra:
        raise UserError(f"`attnbench bench` takes no argument '{extra[0]}' (options only; --help lists them)")
    values = {}
    for name, (arity, kind, default) in BENCH_OPTIONS.items():
        given = p.get(name)
        try:
            if given is None or arity is False:
                value = default if given is None else True
            else:
                value = [kind(v) for v in given] if arity == "+" else kind(given)
        except ValueError:
            raise UserError(f"option {name} of `attnbench bench` takes {kind.__name__} values (got {given})") from None
        values[name[2:].replace("-", "_")] = value
    for key, default in (AGAINST_REFERENCE if values["against_reference"] else AGAINST_SOFTMAX).items():
        if values[key] is None:
            values[key] = default
    if values["against_reference"] and values["causal"]:
        raise UserError("`attnbench bench --against-reference` times the bidirectional ListOps layer; drop --causal")
    args = SimpleNamespace(**values)
    check_sizes(args)
    return args


def check_sizes(args) -> None:
    """Every size at least 1, the heads dividing d_model, the variants known, and the largest
    length's dense attention within the memory available: before anything is allocated."""
    from bench_cli.core.errors import unknown_choice
    from bench_cli.core.sizes import check_at_least, check_fits, check_heads, dense_attention_bytes

    for n in args.seq_lens:
        check_at_least("--seq-lens", n, command="bench")
    for option in ("--d-model", "--heads", "--batch", "--repeats", "--threads"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None:
            check_at_least(option, value, command="bench")
    check_heads(args.d_model, args.heads, "bench")
    if args.budget is not None and args.budget < 0:
        from bench_cli.core.errors import UserError

        raise UserError(f"option --budget of `attnbench bench` takes seconds >= 0 (got {args.budget:g})")
    if not args.against_reference:  # the reference mode names its own baselines (bench_reference.py)
        from attnbench.models.attention import available_attentions

        unknown = sorted(set(args.variants or ()) - set(available_attentions()))
        if unknown:
            raise unknown_choice("variant", unknown[0], available_attentions())
    longest = max(args.seq_lens)
    check_fits(f"`attnbench bench` at N={longest} (batch {args.batch}, {args.heads} heads)",
               dense_attention_bytes(args.batch, args.heads, longest, args.d_model),
               "give smaller --seq-lens or --batch")


HEADERS = ["variant", "N", "forward ms", "x softmax [IQR]", "fwd+bwd ms", "x softmax [IQR]", "fwd tok/s",
           "train tok/s"]


def render(rows, title: str, notes: list[str] = ()) -> None:
    """The table, then one line per note (why a variant shows n/a, options that differ)."""
    from bench_cli.core.ui import console, show_table

    show_table(title, HEADERS, rows)  # blocks instead of folded numbers at 80 columns
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
    if args is None:
        return []
    if args.against_reference:
        from bench_cli.commands.bench_reference import run

        return run(args)
    import torch

    from attnbench.models.attention import available_attentions

    if args.threads:
        torch.set_num_threads(args.threads)
    names = available_attentions()
    if args.variants:  # known: check_sizes
        names = ["softmax"] + [n for n in names if n in args.variants and n != "softmax"]
    from bench_cli.engine.timing import NOISY_NOTE, Spread, TimingSession, ratio_spread

    session = TimingSession(one_thread="--threads 1")
    rows, results = [], []
    for n in args.seq_lens:
        timed = time_length(["softmax"] + [v for v in names if v != "softmax"], n, args)
        reference = timed["softmax"]
        for name, t in timed.items():
            if t is None:
                rows.append([name, str(n), "n/a", "", "n/a", "", "", ""])
                continue
            result = {"variant": name, "n": n}
            cells = []
            for mode, mine, base in zip(("forward", "fwd_bwd"), t, reference):
                time_s, ratio = Spread.of(mine), ratio_spread(mine, base)
                tokens = time_s.scaled(args.batch * n)
                session.judge(ratio if name != "softmax" else time_s)
                result.update({**time_s.columns(f"{mode}_s"), **ratio.columns(f"{mode}_ratio", 4),
                               f"{mode}_rounds": time_s.n, f"{mode}_samples_per_s": round(args.batch / time_s.median, 3),
                               f"{mode}_tokens_per_s": round(tokens.median, 1)})
                cells.append((f"{time_s.median * 1e3:.1f}", ratio.text() + (" !" if ratio.noisy else ""),
                              f"{tokens.median:.3g}"))
            results.append(result)
            (fwd, fwd_x, fwd_tok), (bwd, bwd_x, bwd_tok) = cells
            rows.append([name, str(n), fwd, fwd_x, bwd, bwd_x, fwd_tok, bwd_tok])
    noise = session.done().noise
    for r in results:
        r.update(session.columns())
    mode = "causal" if args.causal else "bidirectional"
    render(rows, f"attention speed ({mode}, d_model={args.d_model}, heads={args.heads}, batch={args.batch}, "
                 f"median of >= {args.repeats} rounds, {session.conditions.threads} threads)"
                 + (f" ({NOISY_NOTE})" if noise else ""),
           [*notes_for(names, args.seq_lens, args),
            "x softmax: median of the rounds' ratios and, in brackets, their IQR (! wider than 10% of the median); "
            "tok/s: batch x N tokens per second (samples/s: tok/s / N)", session.line(), *([noise] if noise else [])])
    return results


if __name__ == "__main__":
    from bench_cli.core.errors import UserError
    from bench_cli.core.ui import fail

    try:
        main()
    except UserError as e:  # one line and exit status 2, as `attnbench bench` says it
        fail(str(e))
