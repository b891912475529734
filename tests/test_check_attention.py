"""`attnbench check-attention`: every registered attention passes its conformance suite, and
attentions that break a declared property fail naming it (test-local variants registered here)."""
from __future__ import annotations

import textwrap

import pytest
import torch

from bench_cli.commands.check_attention import PROPERTIES
from bench_cli.commands.cli import main
from attnbench.models.attention import ATTENTIONS, Capabilities, ProjectedAttention, available_attentions, register_attention
from attnbench.models.attention.base import softmax_kernel

pytestmark = pytest.mark.usefixtures("single_thread")


def check(capsys, *args: str) -> tuple[int, list[str]]:
    """Exit status and output lines of `attnbench check-attention ARGS`, run in this process."""
    try:
        main(["check-attention", *args])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().out.splitlines()


def property_lines(lines: list[str]) -> dict[str, tuple[str, str]]:
    """{property: (status, detail)} from the report's property lines (a long detail continues on
    indented lines)."""
    found, current = {}, None
    for line in lines:
        if current and line.startswith(" "):
            status, detail = found[current]
            found[current] = (status, f"{detail} {line.strip()}")
            continue
        current = next((prop for prop in PROPERTIES if line.startswith(prop + " ")), None)
        if current:
            rest = line[len(current):].strip()
            status = "not declared" if rest.startswith("not declared") else rest.split()[0]
            found[current] = (status, rest[len(status):].strip())
    return found


@pytest.mark.parametrize("name", available_attentions())
def test_every_registered_attention_passes(capsys, name):
    code, lines = check(capsys, name)
    assert code == 0, "\n".join(lines)
    shown = property_lines(lines)
    assert list(shown) == list(PROPERTIES)  # one line per property, in order
    assert all(status in ("pass", "not declared") for status, _ in shown.values())
    assert lines[-1].startswith(f"ok: {name} passes all")
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]


# --------------------------------------------------------------------------- broken attentions


# What the broken attentions below claim (Capabilities() claims nothing)
CLAIMS = Capabilities(causal=True, padding_mask=True)


class NoCross(ProjectedAttention):
    pass  # cross is not declared: the base refuses a context by itself


class PeeksAhead(NoCross):
    """Declares causal, but every position sees the whole sequence."""

    def kernel(self, q, k, v, mask, causal):
        return softmax_kernel(q, k, v, mask, causal=False)


class IgnoresMask(NoCross):
    """Declares padding_mask, but attends to padded keys."""

    def kernel(self, q, k, v, mask, causal):
        return softmax_kernel(q, k, v, None, causal)


class BatchScaled(NoCross):
    """Scales the queries by the largest real key of the whole batch, without declaring batch_coupled."""

    def kernel(self, q, k, v, mask, causal):
        real = k if mask is None else k.masked_fill(~mask[:, None, :, None], 0)
        return softmax_kernel(q / real.abs().amax(), k, v, mask, causal)


class AcceptsContext(ProjectedAttention):
    """Attends to a context without declaring cross (its own key_source skips the base's refusal)."""

    def key_source(self, x, mask, causal, context, context_mask):
        return (x, mask) if context is None else (context, context_mask)

    def kernel(self, q, k, v, mask, causal):
        return softmax_kernel(q, k, v, mask, causal)


class HiddenLoss(NoCross):
    """Has an auxiliary loss the trainer would add, without declaring extra_loss."""

    def kernel(self, q, k, v, mask, causal):
        self._loss = q.pow(2).mean()
        return softmax_kernel(q, k, v, mask, causal)

    def auxiliary_loss(self):
        return getattr(self, "_loss", None)


class Correct(NoCross):
    """A plugin-style attention that keeps what it declares: softmax with a learnt temperature."""

    def __init__(self, d_model, n_heads, **options):
        super().__init__(d_model, n_heads, **options)
        self.log_temperature = torch.nn.Parameter(torch.zeros(n_heads, 1, 1))

    def kernel(self, q, k, v, mask, causal):
        return softmax_kernel(q * self.log_temperature.exp(), k, v, mask, causal, self.attention_dropout())


@pytest.fixture
def registered():
    """register(name, cls, capabilities): a test attention in the registry until the test ends."""
    def register(name, cls, capabilities=CLAIMS):
        register_attention(name, paper="test", equation="-", capabilities=capabilities)(cls)
        return name

    with ATTENTIONS.restoring():
        yield register


@pytest.mark.parametrize("cls, capabilities, failed", [
    (PeeksAhead, CLAIMS, ["causality"]),
    (IgnoresMask, CLAIMS, ["padding"]),
    (BatchScaled, Capabilities(padding_mask=True), ["batch"]),
    (AcceptsContext, CLAIMS, ["cross"]),
    (HiddenLoss, CLAIMS, ["extra loss"]),
])
def test_a_broken_property_fails_naming_it(capsys, registered, cls, capabilities, failed):
    name = registered(f"test_{cls.__name__.lower()}", cls, capabilities)
    code, lines = check(capsys, name, "--length", "8")
    assert code == 1
    shown = property_lines(lines)
    assert [prop for prop, (status, _) in shown.items() if status == "fail"] == failed
    assert lines[-1] == f"failed: {', '.join(failed)} ({len(failed)} of {len(PROPERTIES)} properties)"
    assert all(len(line) <= 80 for line in lines)


def test_a_plugin_that_declares_no_cross_passes_without_saying_why(capsys, registered):
    """The plugin a user most likely writes first, Capabilities(causal=False, padding_mask=True)
    and nothing else, passes; the base refuses its context (and causal=True) by itself."""
    code, lines = check(capsys, registered("test_natural", Correct, Capabilities(padding_mask=True)), "--length", "8")
    assert code == 0, "\n".join(lines)
    assert property_lines(lines)["cross"][0] == "not declared"
    assert Capabilities() == Capabilities(causal=False, padding_mask=False, cross=False, extra_loss=False,
                                          needs_grid=False, sized_by_max_len=False, batch_coupled=False)


def test_the_failure_line_says_where(capsys, registered):
    code, lines = check(capsys, registered("test_peeks", PeeksAhead), "--length", "8")
    status, detail = property_lines(lines)["causality"]
    assert (code, status) == (1, "fail")
    assert "outputs before position 1 change with later tokens" in detail


def test_a_correct_attention_passes_and_batch_coupling_is_not_checked_where_declared(capsys, registered):
    code, lines = check(capsys, registered("test_correct", Correct), "--length", "8", "--batch", "2")
    assert code == 0 and lines[-1].startswith("ok: test_correct passes all 9 declared properties (2 not declared)")
    code, lines = check(capsys, registered("test_coupled", BatchScaled, Capabilities(padding_mask=True, batch_coupled=True)),
                        "--length", "8")
    assert code == 0
    assert property_lines(lines)["batch"][0] == "not declared"


# --------------------------------------------------------------------------- command line


def test_unknown_name_is_the_registrys_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check-attention", "softmaxx"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "unknown attention 'softmaxx' (did you mean 'softmax'?); valid: " in err and "primal" in err


def test_attention_options_and_sizes(capsys):
    code, lines = check(capsys, "primal", "data_dependent=false", "low_rank=3", "--length", "6", "--batch", "2",
                        "--heads", "4", "--d-model", "8", "--seed", "3")
    assert code == 0
    assert lines[0] == "check-attention primal: d_model=8, heads=4, length=6, batch=2, seed=3"
    assert "options: data_dependent=False, low_rank=3, max_len=6" in lines
    assert property_lines(lines)["shape"] == ("pass", "(2, 6, 8), float64 and float32")


@pytest.mark.parametrize("args, message", [
    (["softmax", "frobnicate=1"], "cannot build softmax: SoftmaxAttention got unknown options: frobnicate"),
    (["conv2d", "--length", "15"], "conv2d needs a grid: give a square --length"),
    (["softmax", "--batch", "1"], "--batch must be at least 2"),
    (["softmax", "--lenght", "8"], "unknown option '--lenght'"),
    (["softmax", "beta=1,2"], "KEY=VALUE with one value"),
])
def test_mistakes_are_one_line_and_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["check-attention", *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and message in err and len(err.splitlines()) == 1


def test_a_plugin_attention_is_checked_from_the_command_line(plugin_folder, capsys, monkeypatch):
    """As a user runs it: a module outside the repository, on the path, named in ATTNBENCH_PLUGINS
    (imported in this process as a fresh one imports it: conftest.plugin_folder)."""
    (plugin_folder / "my_leaky_attention.py").write_text(textwrap.dedent("""
        from attnbench.models.attention import Capabilities, ProjectedAttention, register_attention
        from attnbench.models.attention.base import softmax_kernel

        @register_attention("leaky", paper="nobody", equation="-",
                            capabilities=Capabilities(causal=True, padding_mask=True))
        class Leaky(ProjectedAttention):
            def kernel(self, q, k, v, mask, causal):
                return softmax_kernel(q, k, v, mask, causal=False)  # sees the future
    """))
    monkeypatch.setenv("ATTNBENCH_PLUGINS", "my_leaky_attention")
    code, lines = check(capsys, "leaky", "--length", "8")
    assert code == 1, "\n".join(lines)
    assert lines[-1] == f"failed: causality (1 of {len(PROPERTIES)} properties)"
