"""The one timer (bench_cli.engine.timing.time_rounds), the spread it reports and the noise it detects:
deterministic with a fake clock; the commands' noisy flag with a faked load average."""
from __future__ import annotations

import os

import pytest

from bench_cli.core.spread import NOISY_NOTE, Spread, interval_text, ratio_spread
from bench_cli.engine.timing import Conditions, time_rounds, timed


class FakeClock:
    """A clock that moves only when a fake step says how long it took."""

    def __init__(self):
        self.now = 0.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def step(self, name: str, durations):
        durations = iter(durations)

        def run():
            self.calls.append(name)
            self.now += next(durations)
        return timed(run, None, self)


def constant(value):
    while True:
        yield value


def test_steady_steps_stop_after_the_minimum_rounds_with_alternating_order():
    clock = FakeClock()
    a, b = time_rounds([clock.step("a", constant(1.0)), clock.step("b", constant(2.0))], min_rounds=4,
                       budget_s=1e9, warmup=1, clock=clock)
    assert a == [1.0] * 4 and b == [2.0] * 4  # precise at once: no round beyond the minimum
    # warm-up (untimed), then a first in even rounds and b first in odd ones
    assert clock.calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    ratio = ratio_spread(b, a)
    assert (ratio.median, ratio.q1, ratio.q3, ratio.n) == (2.0, 2.0, 2.0, 4)


def test_noisy_steps_run_until_the_budget():
    clock = FakeClock()
    noisy = iter([1.0, 3.0] * 100)
    (times,) = time_rounds([clock.step("a", noisy)], min_rounds=3, budget_s=10.0, warmup=0, clock=clock)
    assert sum(times[:-1]) < 10.0 <= sum(times)  # stopped by the round that spent the budget
    assert Spread.of(times).noisy


def test_one_round_is_never_precise_enough_to_stop():
    """min_rounds=1 (the zoo profile): a single time has no spread to judge, so rounds go on until
    three agree (or the budget ends), not 'IQR 0' after one."""
    clock = FakeClock()
    (times,) = time_rounds([clock.step("a", constant(1.0))], min_rounds=1, budget_s=1e9, warmup=0, clock=clock)
    assert times == [1.0] * 3


def test_max_rounds_caps_a_noisy_series():
    clock = FakeClock()
    (times,) = time_rounds([clock.step("a", iter([1.0, 3.0] * 100))], min_rounds=2, max_rounds=7, budget_s=1e9,
                           warmup=0, clock=clock)
    assert len(times) == 7


def test_a_step_that_cannot_run_adds_no_time():
    clock = FakeClock()
    a, b = time_rounds([clock.step("a", constant(1.0)), lambda: None], min_rounds=3, budget_s=1e9, clock=clock)
    assert a == [1.0] * 3 and b == []


def test_spread_quartiles_rates_and_text():
    s = Spread.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.median, s.q1, s.q3, s.n, s.iqr) == (3.0, 2.0, 4.0, 5, 2.0)
    assert s.noisy and not Spread.of([1.0, 1.01, 1.02]).noisy
    rate = s.scaled(12.0)  # 12 tokens per step: tokens/s, the quartiles swap ends
    assert (rate.median, rate.q1, rate.q3) == (4.0, 3.0, 6.0)
    assert s.text() == "3.00 [2.00-4.00]"
    assert s.columns("t") == {"t": 3.0, "t_q1": 2.0, "t_q3": 4.0}
    assert Spread.of([0.7]).q1 == Spread.of([0.7]).q3 == 0.7
    assert interval_text({"r": "1.5", "r_q1": "1.25", "r_q3": "2"}, "r") == "1.50 [1.25-2.00]"
    assert interval_text({"r": 1.5}, "r") == "1.50" and interval_text({}, "r") == "-"


def test_conditions_say_noisy_when_the_load_exceeds_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    quiet = Conditions.now().done()
    assert quiet.noise([Spread.of([1.0, 1.0, 1.0])]) == "" and quiet.columns()["load_before"] == 0.2
    assert "IQR > 10%" in quiet.noise([Spread.of([1.0, 2.0, 3.0])])  # a wide spread alone is noise too
    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    busy = Conditions.now().done()
    assert busy.noise().startswith(NOISY_NOTE) and "load 7.0 on 2 cores" in busy.noise()


def test_a_timing_session_gives_one_verdict_and_a_row_its_own(monkeypatch):
    """The session profile, bench and bench --against-reference share: the load before and after,
    the spreads judged, and timing_noisy as a reason ('' when the times can be trusted)."""
    from bench_cli.engine.timing import TimingSession

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    session = TimingSession()
    session.judge(Spread.of([1.0, 1.0, 1.0]))
    assert session.done().noise == "" and session.columns()["timing_noisy"] == ""
    wide = session.columns([Spread.of([1.0, 2.0, 3.0])])  # a row's own wide ratio: that row alone is noisy
    assert wide["timing_noisy"].startswith(NOISY_NOTE) and "1 time(s) with IQR > 10%" in wide["timing_noisy"]
    assert session.columns()["timing_noisy"] == "" and wide["load_before"] == 0.2


def test_the_noisy_line_says_which_key_gives_one_thread(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    two = Conditions(7.0, 2, 2, 7.0)
    assert two.noise() == f"{NOISY_NOTE} or with trainer.num_threads=1 (2 threads; load 7.0 on 2 cores)"
    bench = Conditions(7.0, 2, 2, 7.0, one_thread="--threads 1")
    assert "or with --threads 1 (2 threads;" in bench.noise()
    one = Conditions(7.0, 1, 2, 7.0)
    assert one.noise() == f"{NOISY_NOTE} (load 7.0 on 2 cores)"  # nothing to change but the machine
    assert Conditions(0.1, 2, 2, 2.1).noise() == ""  # several threads alone are not noise


def test_a_run_uses_one_thread_unless_told_otherwise():
    """The default run's model is small: on a shared 2-core machine two threads made it 6-30x slower."""
    import torch
    from omegaconf import OmegaConf

    from bench_cli.config.compose import option_data
    from bench_cli.engine.env import prepare_environment

    trainer = {**option_data("trainer", "default"), "device": "cpu"}
    before = torch.get_num_threads()
    try:
        for asked, used in ((None, 1), (2, 2)):
            torch.set_num_threads(3)
            overrides = {} if asked is None else {"num_threads": asked}
            prepare_environment(OmegaConf.create({"seed": 0, "trainer": {**trainer, **overrides}}))
            assert torch.get_num_threads() == used
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("load", [0.0, 50.0])
def test_bench_says_noisy_under_a_high_load(monkeypatch, capsys, load):
    from bench_cli.commands.bench_attention import main

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    results = main(["--seq-lens", "16", "--d-model", "8", "--heads", "2", "--repeats", "1", "--budget", "0",
                    "--variants", "linear"])
    out = " ".join(capsys.readouterr().out.split())
    # one round: no spread, the load decides; the column is the reason ('' when trusted), as in a run's record
    assert all(r["timing_noisy"] == (f"{NOISY_NOTE} (load {load:.1f} on 2 cores)" if load else "") for r in results)
    assert ("noisy: rerun on an idle machine" in out) == (load > 0)
    assert f"load average (1 min) before {load:.2f}" in out


def test_a_records_epoch_time_is_the_median_with_its_spread(monkeypatch):
    from types import SimpleNamespace

    from bench_cli.results import schema

    assert set(schema.TIMING_COLUMNS) <= set(schema.COLUMNS)
    slow_first = SimpleNamespace(epoch_times_s=[9.0, 1.0, 1.0, 1.0, 1.0], train_time_s=13.0, epochs_run=5)
    cols = schema.epoch_time_columns(slow_first)
    assert cols == {"time_per_epoch_s": 1.0, "time_per_epoch_s_q1": 1.0, "time_per_epoch_s_q3": 1.0}  # not 13 / 5
    assert schema.epoch_time_columns(SimpleNamespace(train_time_s=4.0, epochs_run=2)) == {"time_per_epoch_s": 2.0}
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    row = {"epochs_run": 5, **cols}
    quiet = schema.timing_columns(Conditions.now().done(), row)
    assert quiet["timing_noisy"] == "" and quiet["load_before"] == 0.5 and quiet["threads"] >= 1
    wide = {"epochs_run": 5, "time_per_epoch_s": 1.0, "time_per_epoch_s_q1": 0.5, "time_per_epoch_s_q3": 2.0}
    assert schema.timing_columns(Conditions.now().done(), wide)["timing_noisy"].startswith(NOISY_NOTE)
    few = {**wide, "epochs_run": 3}  # three epochs do not judge the spread
    assert schema.timing_columns(Conditions.now().done(), few)["timing_noisy"] == ""


def test_an_experiment_reports_time_ratio_carries_its_spread_and_the_flag():
    from bench_cli.results.report import render, select, spec, stats

    def cell(times, noisy=""):
        rows = [{"time_per_epoch_s": t, "timing_noisy": noisy if i == 0 else ""} for i, t in enumerate(times)]
        return select.Cell("d", "m", rows=rows)

    column = next(c for c in spec.EFFICIENCY if c.column == "time_per_epoch_s")
    quiet = stats.column_values(column, cell([1.0, 3.0]), cell([2.0, 2.0]))
    assert quiet["time_ratio"] == 1.0 and quiet["time_ratio_noisy"] == 0
    assert quiet["time_ratio_sd"] == pytest.approx(2 ** 0.5 / 2)  # std 1.41 of a mean 2, the base's std 0
    assert render.column_cell(quiet, column) == "1.00 ± 0.71"
    flagged = stats.column_values(column, cell([1.0, 3.0]), cell([2.0, 2.0], noisy="noisy: rerun"))
    assert flagged["time_ratio_noisy"] == 1 and render.column_cell(flagged, column).endswith(" noisy")
