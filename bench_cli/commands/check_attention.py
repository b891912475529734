"""`attnbench check-attention NAME [options]`: the conformance suite of a registered attention.

Every attention of the registry, built-in or from a plugin, is run on small random inputs in
float64 and float32 and checked for what its ``Capabilities`` declare; each property prints one
line (pass / fail / not declared) and the command exits 1 naming every failed property.

Inputs: ``x`` (batch, length, d_model) from N(0, 1) with the seed; padding masks (when
``padding_mask`` is declared) that cycle over the samples: right padding (the last quarter),
holes (positions 1 and length // 2) and left padding (the first quarter, where an early causal
query sees no real key). The module is built once per dtype from the same seed (float64 and
float32 share the weights), with the options a task's role would give it (models/roles.py):
``max_len`` = the length for variants sized by the sequence, a square ``grid`` for variants that
need one, and for the causal checks the options of a causal role (``CAUSAL_ROLE_OPTIONS``).

Two outputs "agree" when ``max |a - b| <= tol * max(1, max |b|)`` over the compared positions,
with ``tol`` = ``TOLERANCE[dtype]``: rounding, not a change of what is computed.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

import torch

from bench_cli.core.errors import UserError, first_line
from bench_cli.core.sizes import check_fits, check_heads, dense_attention_bytes
from attnbench.models.attention import (AttentionSpec, Capabilities, attention_spec, build_attention,
                              collect_auxiliary_loss)

DTYPES = (torch.float64, torch.float32)
# Agreement of two outputs that must be equal up to rounding (module docstring).
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
# float32 against float64 on the same weights and inputs, relative to the output's scale: about 800
# float32 epsilons (1.2e-7) of accumulated rounding (the built-ins stay below 1e-6), far below any
# change of formula.
FLOAT32_TOLERANCE = 1e-4
# Padded tokens' content is replaced by noise this large, so that any leak is visible.
NOISE_SCALE = 50.0
# Options a causal role gives a variant (as bench_cli/commands/bench_attention.py and the causal tasks' configs):
# Primal-Attention runs data-independent causally (papers/004 Listing 1: the rows X' sampled from the
# input would see the future).
CAUSAL_ROLE_OPTIONS: dict[str, dict] = {"primal": {"data_dependent": False}}
DETERMINISM_DROPOUT = 0.1  # built with attention dropout, so eval mode must switch it off

PROPERTIES = ("shape", "finite", "padding", "causality", "cross", "batch", "determinism", "float32", "flops",
              "memory", "extra loss")
PASS, FAIL, NOT_DECLARED = "pass", "fail", "not declared"
WIDTH = 80  # every line fits an 80-column terminal; long messages continue under the detail column


class PropertyFailed(Exception):
    """A property does not hold; the message says where and by how much."""


@dataclass
class Outcome:
    prop: str
    status: str  # PASS | FAIL | NOT_DECLARED
    detail: str = ""


@dataclass
class Setup:
    """What the suite runs: the variant, its options and the input sizes."""

    name: str
    d_model: int = 16
    heads: int = 2
    length: int = 16  # a square: a 4 x 4 grid for variants that need one
    batch: int = 3  # one sample of each padding pattern
    seed: int = 0
    options: dict = field(default_factory=dict)  # the attention's own options (key=value)

    @property
    def spec(self) -> AttentionSpec:
        return attention_spec(self.name)

    def build_options(self, causal: bool = False) -> dict:
        """The options a task's role would pass (models/roles.py build_layer_attentions)."""
        caps = self.spec.capabilities
        options: dict = {}
        if causal:
            options.update(CAUSAL_ROLE_OPTIONS.get(self.name, {}))
        options.update(self.options)
        if (not caps.variable_length or caps.sized_by_max_len) and options.get("max_len") is None:
            options["max_len"] = self.length
        if caps.needs_grid and options.get("grid") is None:
            side = math.isqrt(self.length)
            options["grid"] = (side, side)
        return options

    def build(self, causal: bool = False, **extra) -> torch.nn.Module:
        """The variant with the role's options, its weights drawn from the seed (the caller's
        random state is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return build_attention(self.name, d_model=self.d_model, n_heads=self.heads,
                                   **{**self.build_options(causal), **extra})


class Suite:
    """The inputs and the modules of one check, built lazily and shared by the properties."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.caps: Capabilities = setup.spec.capabilities
        self.generator = torch.Generator().manual_seed(setup.seed)
        self.x = self.randn(setup.batch, setup.length, setup.d_model)
        self.padding = padding_patterns(setup.batch, setup.length)
        self.mask = self.padding if self.caps.padding_mask else None
        self._modules: dict = {}

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator, dtype=torch.float64)

    def module(self, dtype: torch.dtype, causal: bool = False, **extra) -> torch.nn.Module:
        """The variant in eval mode, weights from the seed (the same for every dtype)."""
        key = (dtype, causal, tuple(sorted(extra.items())))
        if key not in self._modules:
            self._modules[key] = self.setup.build(causal, **extra).to(dtype).eval()
        return self._modules[key]

    def modes(self) -> list[bool]:
        """The causal flags to check: bidirectional, and causal where declared."""
        return [False, True] if self.caps.causal else [False]

    def run(self, dtype, x, mask, causal=False, **kw) -> torch.Tensor:
        with torch.no_grad():
            return self.module(dtype, causal)(x.to(dtype), mask, causal=causal, **kw)


def padding_patterns(batch: int, length: int) -> torch.Tensor:
    """(batch, length) True for real tokens: right padding, holes, left padding, in turn."""
    quarter = max(1, length // 4)
    mask = torch.ones(batch, length, dtype=torch.bool)
    for b in range(batch):
        kind = b % 3
        if kind == 0:
            mask[b, length - quarter:] = False
        elif kind == 1:
            mask[b, sorted({1, length // 2})] = False
        else:
            mask[b, :quarter] = False
    return mask


def where(dtype: torch.dtype, causal: bool) -> str:
    return f"{'causal, ' if causal else ''}{str(dtype).removeprefix('torch.')}"


def deviation(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a - b|, the allowed deviation's scale max(1, max |b|)), in float64."""
    a, b = a.double(), b.double()
    if a.numel() == 0:
        return 0.0, 1.0
    return (a - b).abs().max().item(), max(1.0, b.abs().max().item())


def agree(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Raise PropertyFailed (``what``, and by how much) unless a and b agree up to rounding."""
    diff, scale = deviation(a, b)
    if not diff <= TOLERANCE[dtype] * scale:  # also catches NaN
        raise PropertyFailed(f"{what} (max diff {diff:.2g})")


def finite(t: torch.Tensor, what: str) -> None:
    if not torch.isfinite(t).all():
        raise PropertyFailed(f"{what} is not finite")


# --------------------------------------------------------------------------- properties


def check_shape(s: Suite) -> str:
    """The output has the input's shape and dtype, in float64 and float32, bidirectional and causal."""
    for dtype in DTYPES:
        for causal in s.modes():
            y = s.run(dtype, s.x, s.mask, causal)
            if y.shape != s.x.shape or y.dtype != dtype:
                raise PropertyFailed(f"{where(dtype, causal)}: got {tuple(y.shape)} {y.dtype}, "
                                     f"expected {tuple(s.x.shape)} {dtype}")
    return f"{tuple(s.x.shape)}, float64 and float32"


def check_finite(s: Suite) -> str:
    """Train mode: finite outputs, and finite gradients of the input and of every parameter that
    gets one, from a loss over the real positions (plus the extra loss, if any)."""
    weights = s.randn(*s.x.shape)
    real = s.padding if s.mask is not None else torch.ones_like(s.padding)
    for dtype in DTYPES:
        for causal in s.modes():
            m = s.module(dtype, causal).train()
            try:
                m.zero_grad(set_to_none=True)
                x = s.x.to(dtype).clone().requires_grad_(True)
                y = m(x, s.mask, causal=causal)
                finite(y, f"{where(dtype, causal)}: output")
                loss = (y * weights.to(dtype))[real].sum()
                extra = collect_auxiliary_loss(m)
                (loss if extra is None else loss + extra).backward()
                finite(x.grad, f"{where(dtype, causal)}: input gradient")
                for pname, p in m.named_parameters():
                    if p.grad is not None:
                        finite(p.grad, f"{where(dtype, causal)}: gradient of {pname}")
            finally:
                m.zero_grad(set_to_none=True)
                m.eval()
    return "outputs, input and parameter gradients (train mode)"


def check_padding(s: Suite) -> str | None:
    """Outputs at real positions do not change when padded positions' content is replaced by noise."""
    if not s.caps.padding_mask:
        return None
    noisy = torch.where(s.padding[..., None], s.x, NOISE_SCALE * s.randn(*s.x.shape))
    for dtype in DTYPES:
        for causal in s.modes():
            base = s.run(dtype, s.x, s.padding, causal)
            out = s.run(dtype, noisy, s.padding, causal)
            agree(out[s.padding], base[s.padding], dtype,
                  f"{where(dtype, causal)}: real outputs change with the padded tokens' content")
    return "real outputs ignore padded content" + (", also causal" if s.caps.causal else "")


def check_causality(s: Suite) -> str | None:
    """Run causally, the outputs before position t do not change when the tokens from t on change
    (t = 1, length // 2, length - 1), with no padding and with the padding masks."""
    if not s.caps.causal:
        return None
    n = s.setup.length
    cuts = sorted({1, n // 2, n - 1})
    masks = [None, s.padding] if s.caps.padding_mask else [None]
    for dtype in DTYPES:
        for mask in masks:
            base = s.run(dtype, s.x, mask, causal=True)
            for t in cuts:
                changed = s.x.clone()
                changed[:, t:] = s.randn(s.setup.batch, n - t, s.setup.d_model)
                out = s.run(dtype, changed, mask, causal=True)
                padded = "" if mask is None else ", padded"
                agree(out[:, :t], base[:, :t], dtype,
                      f"{where(dtype, True)}{padded}: outputs before position {t} change with later tokens")
    return f"outputs before t ignore tokens from t on, t={','.join(map(str, cuts))}"


def check_cross(s: Suite) -> str | None:
    """Declared: for contexts shorter and longer than x, the output has x's shape, is finite,
    depends on the context's real tokens and (with ``padding_mask``) not on the content of the
    tokens ``context_mask`` pads. Not declared: a context is refused with a ValueError."""
    b, n, d = s.x.shape
    lengths = sorted({max(2, n // 2), n + 3})
    if not s.caps.cross:
        try:
            s.run(torch.float64, s.x, s.mask, context=s.randn(b, lengths[0], d))
        except ValueError:
            return None
        raise PropertyFailed("cross is not declared, but a context is accepted (expected a ValueError)")
    real = s.padding if s.mask is not None else torch.ones_like(s.padding)  # padded queries are never read
    for m_len in lengths:
        context = s.randn(b, m_len, d)
        context_real = padding_patterns(b, m_len) if s.mask is not None else torch.ones(b, m_len, dtype=torch.bool)
        context_mask = context_real if s.mask is not None else None
        noisy = torch.where(context_real[..., None], context, NOISE_SCALE * s.randn(b, m_len, d))
        other = torch.where(context_real[..., None], s.randn(b, m_len, d), context)
        for dtype in DTYPES:
            label = f"{where(dtype, False)}, context of {m_len}"

            def attend(c: torch.Tensor, dtype=dtype, context_mask=context_mask) -> torch.Tensor:
                return s.run(dtype, s.x, s.mask, context=c.to(dtype), context_mask=context_mask)

            base = attend(context)
            if base.shape != s.x.shape:
                raise PropertyFailed(f"{label}: output {tuple(base.shape)}, expected {tuple(s.x.shape)}")
            finite(base[real], f"{label}: output")
            if context_mask is not None:
                agree(attend(noisy)[real], base[real], dtype, f"{label}: outputs change with padded context content")
            diff, scale = deviation(attend(other)[real], base[real])
            if diff <= TOLERANCE[dtype] * scale:
                raise PropertyFailed(f"{label}: outputs ignore the context's real tokens")
    honoured = ", context_mask honoured" if s.mask is not None else ""
    return f"contexts of {' and '.join(map(str, lengths))}{honoured}"


def check_batch(s: Suite) -> str | None:
    """Each sample run alone gives its output in the batch (unless the variant declares
    ``batch_coupled``: its reference shares statistics over the batch)."""
    if s.caps.batch_coupled:
        return None
    for dtype in DTYPES:
        for causal in s.modes():
            batch = s.run(dtype, s.x, s.mask, causal)
            for i in range(s.setup.batch):
                alone = s.run(dtype, s.x[i:i + 1], None if s.mask is None else s.mask[i:i + 1], causal)
                real = slice(None) if s.mask is None else s.mask[i]
                agree(batch[i][real], alone[0][real], dtype,
                      f"{where(dtype, causal)}: sample {i} alone differs from its output in the batch")
    return "each sample alone gives its output in the batch"


def check_determinism(s: Suite) -> str:
    """In eval mode, built with attention dropout, two passes over the same input are identical."""
    extra = {} if "dropout" in s.setup.options else {"dropout": DETERMINISM_DROPOUT}
    for dtype in DTYPES:
        for causal in s.modes():
            m = s.module(dtype, causal, **extra)
            with torch.no_grad():
                first = m(s.x.to(dtype), s.mask, causal=causal)
                second = m(s.x.to(dtype), s.mask, causal=causal)
            if not torch.equal(first, second):
                diff, _ = deviation(first, second)
                raise PropertyFailed(f"{where(dtype, causal)}: two eval passes differ (max diff {diff:.2g})")
    shown = f" (dropout={extra['dropout']})" if extra else ""
    return f"two eval passes identical{shown}"


def check_float32(s: Suite) -> str:
    """float32 outputs agree with float64 ones (same weights and inputs) at the real positions:
    max |y32 - y64| <= FLOAT32_TOLERANCE * max(1, max |y64|)."""
    real = s.mask if s.mask is not None else torch.ones_like(s.padding)
    worst = 0.0
    for causal in s.modes():
        y64 = s.run(torch.float64, s.x, s.mask, causal)[real]
        y32 = s.run(torch.float32, s.x, s.mask, causal)[real]
        diff, scale = deviation(y32, y64)
        if not diff <= FLOAT32_TOLERANCE * scale:
            raise PropertyFailed(f"{where(torch.float32, causal)}: max |f32 - f64| {diff:.2g} > "
                                 f"{FLOAT32_TOLERANCE:.0e} x {scale:.3g}")
        worst = max(worst, diff / scale)
    return f"max |f32 - f64| {worst:.1e} of scale (tolerance {FLOAT32_TOLERANCE:.0e})"


def _measured_inputs(s: Suite) -> dict:
    return {"x": s.x.float(), "mask": s.mask}


def _objective(y: torch.Tensor) -> torch.Tensor:
    return y.pow(2).mean()


def check_flops(s: Suite) -> str:
    """FlopCounterMode counts FLOPs (bench_cli.engine.counting, with the CPU SDPA formulas registered) of a
    float32 forward and of a training step: both non-zero."""
    from bench_cli.engine.counting import flops_forward, flops_train_step
    from bench_cli.core.ui import human

    m = s.module(torch.float32)
    forward = flops_forward(m, _measured_inputs(s))
    train = flops_train_step(m, _measured_inputs(s), _objective)
    if not forward > 0 or not train > 0:
        raise PropertyFailed(f"FlopCounterMode counts forward {forward}, train step {train}")
    return f"forward {human(forward)}, train step {human(train)} FLOPs"


def check_memory(s: Suite) -> str:
    """Peak memory (bench_cli.engine.counting) of a float32 training step and of inference: both measured, non-zero."""
    from bench_cli.engine.counting import peak_memory_inference, peak_memory_train_step
    from bench_cli.core.ui import human

    m = s.module(torch.float32)
    train = peak_memory_train_step(m, _measured_inputs(s), _objective)
    infer = peak_memory_inference(m, _measured_inputs(s))
    if not train > 0 or not infer > 0:
        raise PropertyFailed(f"peak memory measured as train step {train}, inference {infer} bytes")
    return f"peak: train step {human(train, 'B')}, inference {human(infer, 'B')}"


def check_extra_loss(s: Suite) -> str | None:
    """Declared: after a train-mode forward, ``collect_auxiliary_loss`` gives a finite scalar whose
    gradients are finite and reach a parameter. Not declared: there is no auxiliary loss (the
    trainer adds any module's ``auxiliary_loss()``, declared or not)."""
    for dtype in DTYPES:
        m = s.module(dtype).train()
        try:
            m.zero_grad(set_to_none=True)
            m(s.x.to(dtype), s.mask)
            loss = collect_auxiliary_loss(m)
            if not s.caps.extra_loss:
                if loss is not None:
                    raise PropertyFailed("auxiliary_loss() returns a loss, but extra_loss is not declared")
                continue
            label = where(dtype, False)
            if loss is None:
                raise PropertyFailed(f"{label}: extra_loss is declared, but no auxiliary_loss() after a forward")
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise PropertyFailed(f"{label}: the extra loss is not a scalar tensor")
            finite(loss, f"{label}: the extra loss")
            if not loss.requires_grad:
                raise PropertyFailed(f"{label}: the extra loss is not differentiable (no grad_fn)")
            loss.backward()
            reached = [p for p in m.parameters() if p.grad is not None]
            for p in reached:
                finite(p.grad, f"{label}: a gradient of the extra loss")
            if not any(p.grad.abs().sum() > 0 for p in reached):
                raise PropertyFailed(f"{label}: the extra loss reaches no parameter")
        finally:
            m.zero_grad(set_to_none=True)
            m.eval()
    if not s.caps.extra_loss:
        return None
    return f"finite, differentiable, reaches {len(reached)} parameters"


CHECKS = {
    "shape": check_shape,
    "finite": check_finite,
    "padding": check_padding,
    "causality": check_causality,
    "cross": check_cross,
    "batch": check_batch,
    "determinism": check_determinism,
    "float32": check_float32,
    "flops": check_flops,
    "memory": check_memory,
    "extra loss": check_extra_loss,
}
NOT_DECLARED_DETAIL = {
    "padding": "padding_mask not declared",
    "causality": "causal not declared",
    "cross": "cross not declared; a context is refused",
    "batch": "batch_coupled: samples share batch-wide statistics",
    "extra loss": "extra_loss not declared; no auxiliary loss",
}


def run_suite(setup: Setup) -> list[Outcome]:
    """Every property in PROPERTIES order. An exception of the attention is that property's failure."""
    suite = Suite(setup)
    outcomes = []
    for prop in PROPERTIES:
        try:
            detail = CHECKS[prop](suite)
        except PropertyFailed as e:
            outcomes.append(Outcome(prop, FAIL, str(e)))
            continue
        except Exception as e:  # the attention raised: the property fails with its message
            message = first_line(e)
            outcomes.append(Outcome(prop, FAIL, f"{type(e).__name__}: {message}"))
            continue
        outcomes.append(Outcome(prop, NOT_DECLARED, NOT_DECLARED_DETAIL[prop]) if detail is None
                        else Outcome(prop, PASS, detail))
    return outcomes


# --------------------------------------------------------------------------- command line

# --name: (type, default, what); each takes one value.
OPTIONS = {
    "--d-model": (int, Setup.d_model, "model width"),
    "--heads": (int, Setup.heads, "attention heads"),
    "--length": (int, Setup.length, "sequence length (a square for variants that need a grid)"),
    "--batch": (int, Setup.batch, "samples per batch (at least 2)"),
    "--seed": (int, Setup.seed, "seed of the weights and inputs"),
}
USAGE = ("usage: attnbench check-attention NAME [--d-model D] [--heads H] [--length N] [--batch B] [--seed S] "
         "[KEY=VALUE ...]\n\nKEY=VALUE are the attention's options (as model.attention.KEY=VALUE), e.g. "
         "`attnbench check-attention primal data_dependent=false`.\n\n" + __doc__.strip())


def attention_options(overrides: list[str]) -> dict:
    """``key=value`` attention options, values in Hydra's grammar (as ``model.attention.key=value``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    options = {}
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception as e:  # Hydra's grammar error: its message says where
            raise UserError(f"check-attention: cannot parse the attention option '{text}': "
                            f"{first_line(e)}") from None
        key = override.get_key_element()
        if not key.isidentifier() or override.is_sweep_override():
            raise UserError(f"check-attention: attention options are KEY=VALUE with one value, got '{text}'")
        options[key] = override.value()
    return options


def parse_setup(args: list[str]) -> Setup | None:
    """The Setup of ``attnbench check-attention ARGS``; None after printing the usage (-h, --help)."""
    from bench_cli.config.args import parse

    p = parse("check-attention", args, {**{name: True for name in OPTIONS}, "-h": False, "--help": False})
    if p.get("-h") or p.get("--help"):
        from bench_cli.core.ui import usage_text

        print(usage_text(USAGE))
        return None
    if len(p.positional) != 1:
        raise UserError("usage: attnbench check-attention NAME [--d-model D] [--heads H] [--length N] "
                        "[--batch B] [--seed S] [KEY=VALUE ...]")
    name = p.positional[0]
    spec = attention_spec(name)  # an unknown name: the registry's one line with the valid names
    values = {}
    for option, (kind, _default, _what) in OPTIONS.items():
        given = p.get(option)
        if given is None:
            continue
        try:
            values[option[2:].replace("-", "_")] = kind(given)
        except ValueError:
            raise UserError(f"option {option} of `attnbench check-attention` takes an integer (got {given})") from None
    setup = Setup(name=name, options=attention_options(p.overrides), **values)
    if min(setup.d_model, setup.heads, setup.length) < 1 or setup.length < 4:
        raise UserError("check-attention: --d-model and --heads must be positive and --length at least 4")
    if setup.batch < 2:
        raise UserError("check-attention: --batch must be at least 2 (the samples of a batch are compared)")
    check_heads(setup.d_model, setup.heads, "check-attention")
    check_fits(f"check-attention {name} at --length {setup.length} (--batch {setup.batch})",
               dense_attention_bytes(setup.batch, setup.heads, setup.length, setup.d_model, bytes_per_value=8),
               "give a smaller --length or --batch")
    if spec.capabilities.needs_grid and "grid" not in setup.options and math.isqrt(setup.length) ** 2 != setup.length:
        raise UserError(f"check-attention: {name} needs a grid: give a square --length (e.g. 16), "
                        f"got {setup.length}")
    for causal in (False, True):  # refuse options the variant does not take before any property runs
        if causal and not spec.capabilities.causal:
            continue
        try:
            setup.build(causal)
        except (TypeError, ValueError) as e:
            raise UserError(f"check-attention: cannot build {name}: {first_line(e)}") from None
    return setup


def render(setup: Setup, outcomes: list[Outcome]) -> int:
    """Print the header, one line per property and the verdict; the exit status (0, or 1 on failures)."""
    from rich.text import Text

    from bench_cli.core.ui import console

    def say(text: Text | str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    caps = setup.spec.capabilities
    declared = [f for f in Capabilities.__dataclass_fields__ if isinstance(getattr(caps, f), bool) and getattr(caps, f)]
    shown = setup.build_options()
    header = (f"check-attention {setup.name}: d_model={setup.d_model}, heads={setup.heads}, length={setup.length}, "
              f"batch={setup.batch}, seed={setup.seed}")
    for line in textwrap.wrap(header, WIDTH, subsequent_indent="  "):
        say(line)
    for line in textwrap.wrap(f"declares: {', '.join(declared) or 'nothing'}", WIDTH, subsequent_indent="  "):
        say(line)
    if shown:
        options = ", ".join(f"{k}={v}" for k, v in shown.items())
        for line in textwrap.wrap(f"options: {options}", WIDTH, subsequent_indent="  "):
            say(line)
    causal_extra = CAUSAL_ROLE_OPTIONS.get(setup.name, {})
    if caps.causal and any(k not in setup.options for k in causal_extra):
        say(f"causal checks with {', '.join(f'{k}={v}' for k, v in causal_extra.items())} (a causal role's options)")
    styles = {PASS: "green", FAIL: "bold red", NOT_DECLARED: "dim"}
    label_width = max(map(len, PROPERTIES)) + 2
    status_width = len(NOT_DECLARED) + 2
    indent = " " * (label_width + status_width)
    for o in outcomes:
        wrapped = textwrap.wrap(o.detail, WIDTH - len(indent)) or [""]
        line = Text(f"{o.prop:<{label_width}}") + Text(f"{o.status:<{status_width}}", style=styles[o.status])
        line += wrapped[0]
        say(line)
        for more in wrapped[1:]:
            say(indent + more)
    failed = [o.prop for o in outcomes if o.status == FAIL]
    if failed:
        verdict = f"failed: {', '.join(failed)} ({len(failed)} of {len(outcomes)} properties)"
        for line in textwrap.wrap(verdict, WIDTH, subsequent_indent="  "):
            say(Text(line, style="bold red"))
        return 1
    passed = sum(o.status == PASS for o in outcomes)
    say(Text(f"ok: {setup.name} passes all {passed} declared properties "
             f"({len(outcomes) - passed} not declared)", style="green"))
    return 0


def cmd_check_attention(args: list[str]) -> None:
    """`attnbench check-attention NAME [options]`: exit 0 when every property holds, 1 otherwise."""
    setup = parse_setup(args)
    if setup is None:
        return
    code = render(setup, run_suite(setup))
    if code:
        raise SystemExit(code)
