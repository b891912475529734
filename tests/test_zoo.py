"""The attention zoo (every attention on every offline task; conf/experiment/zoo/,
bench_cli/results/report/zoo.py): its job list comes from the model group and the registry, covers every
offline task, leaves out what a task cannot run (with the reason) in the plan and in the sweep alike; a
tiny sweep makes records, the report and a plot."""
from __future__ import annotations

import pytest

from bench_cli.config import compose
from bench_cli.config import search_path
from bench_cli.commands import sweep as sweep_command
from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records
from bench_cli.results.report import zoo

OFFLINE = {("uea", "JapaneseVowels"), ("uea", "BasicMotions"), ("tser", "Covid3Month"),
           ("lra_listops", "listops_generated"), ("vit", "mnist5k")}


@pytest.fixture
def probe_attention(tmp_path, monkeypatch):
    """A built-in-looking attention that cannot take a padding mask, with a model preset in a
    config folder searched after conf/ (as a new conf/model/<name>.yaml would be)."""
    from attnbench.models.attention import registry

    softmax = registry.attention_spec("softmax")
    spec = registry.AttentionSpec(name="zoo_probe", factory=softmax.factory, paper="a test", equation="-",
                                  capabilities=registry.Capabilities(padding_mask=False),
                                  owner="attnbench.models.attention.zoo_probe")
    (tmp_path / "conf" / "model").mkdir(parents=True)
    preset = tmp_path / "conf" / "model" / "zoo_probe.yaml"
    monkeypatch.setattr(search_path, "_CONFIG_DIRS", [tmp_path / "conf"])
    with registry.ATTENTIONS.restoring():
        registry.ATTENTIONS.register("zoo_probe", spec, owner=spec.owner)
        yield preset


def test_the_zoo_is_every_model_preset_on_every_offline_task():
    plan, _ = zoo.zoo_plan("zoo/offline")
    assert {(c.task, c.dataset) for c in plan.cases} == OFFLINE
    assert plan.models == compose.group_options("model") and {"softmax", "primalformer", "flowformer"} <= set(plan.models)
    assert all(c.budget for c in plan.cases)  # the report states each case's budget
    assert not plan.unpreset  # every built-in attention has a preset
    assert len(plan.jobs(seeds=(0, 1, 2))) == sum(len(plan.models) - len(c.skipped) for c in plan.cases) * 3


def test_a_new_attention_joins_the_zoo_and_incapable_pairs_are_left_out_with_the_reason(probe_attention):
    assert "zoo_probe" in zoo.presetless_attentions(compose.group_options("model"))  # registered, no preset yet
    probe_attention.write_text("name: zoo_probe\nattention: {name: zoo_probe, dropout: 0.0}\nfinal_attention: null\n")
    plan, _ = zoo.zoo_plan("zoo/offline")
    assert "zoo_probe" in plan.models and not plan.unpreset
    skipped = {c.label: c.skipped for c in plan.cases}
    assert "lacks padding_mask" in skipped["uea/BasicMotions"]["zoo_probe"]   # padded series need the mask
    assert "zoo_probe" not in skipped["vit/mnist5k"]                          # images are never padded
    assert ("basic_motions", "zoo_probe", 0) not in plan.jobs() and ("mnist5k", "zoo_probe", 0) in plan.jobs()
    # the sweep's plan leaves out the same pair, with the same reason
    sweep = sweep_command.plan_sweep(["experiment=zoo/offline", "experiment/zoo/_case=basic_motions,mnist5k",
                          "model=zoo_probe,softmax", "seed=0"])
    kept, left_out = sweep_command.skip_incapable(sweep.jobs)
    assert sorted(j.label for j in kept) == ["uea/BasicMotions softmax seed=0", "vit/mnist5k softmax seed=0",
                                             "vit/mnist5k zoo_probe seed=0"]
    assert [(j.label, reason) for j, reason in left_out] == [
        ("uea/BasicMotions zoo_probe seed=0", skipped["uea/BasicMotions"]["zoo_probe"])]


def test_a_tiny_zoo_sweep_gives_records_the_report_and_a_plot(workdir, monkeypatch, capsys):
    records = workdir / "zoo.records.csv"
    profile = workdir / "profile.csv"  # two rows of `attnbench profile`'s CSV
    profile.write_text("model,seq_len,model_status,ratio_time_train_s,ratio_peak_mem_train_bytes,ratio_time_train_s_q1,"
                       "ratio_time_train_s_q3,timing_noisy\n"
                       "linear,1024,ok,0.5,0.25,0.4,0.6,noisy: rerun on an idle machine (load 9 on 2 cores)\n"
                       "linear,4096,oom,,,,,\n")
    monkeypatch.delenv("ATTNBENCH_DATA")  # BasicMotions comes from sktime's copy
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine: the runs' times are not flagged
    toy = ["trainer.max_epochs=1", f"paths.output_dir={workdir / 'outputs'}", f"results.path={records}"]
    try:
        main(["sweep", "experiment=zoo/offline", "experiment/zoo/_case=basic_motions", "model=softmax,linear",
              "seed=0", *toy])
    except SystemExit as e:
        assert not e.code
    rows = read_records(records)
    assert sorted((r["model"], r["status"]) for r in rows) == [("linear", "ok"), ("softmax", "ok")]
    out = workdir / "report"
    main(["report", "zoo/offline", "--records", str(records), "--out", str(out), f"report.profile_csv={profile}"])
    md = (out / "zoo.md").read_text()
    section = md.split("## uea/BasicMotions")[1].split("##")[0]
    assert "| softmax | 1 |" in section and "| linear | 1 |" in section and "1.00 | 1.00 | 1.00 |" in section
    assert "![uea/BasicMotions](uea_BasicMotions.png)" in section
    assert (out / "uea_BasicMotions.png").stat().st_size > 10_000
    assert "[vector PDF](uea_BasicMotions.pdf)" in section and (out / "uea_BasicMotions.pdf").is_file()
    # the profile's ratios at 1K/2K/4K, a time's with its IQR and the flag of the busy machine it was taken on
    assert "| linear | 0.50 [0.40-0.60] noisy | — | oom | 0.25 | — | oom |" in md
    assert "budget uea/BasicMotions: 1 layer, d_model 32" in md
    prose = [line for line in md.splitlines() if not line.startswith(("|", "!["))]
    assert all(len(line) <= 80 or " " not in line.strip() for line in prose)  # a long path keeps its own line


def test_presets_that_are_the_same_model_are_named_and_a_tied_metric_alone_is_not_enough():
    from bench_cli.results.report.select import Cell

    def entry(model, losses, accuracies=(50.0, 60.0)):
        rows = [{"seed": s, "test_score": a, "test_loss": loss} for s, (a, loss) in enumerate(zip(accuracies, losses))]
        return zoo.Entry(model, Cell("d", model, values=dict(enumerate(accuracies)), rows=rows), {}, {})

    same = (0.51, 0.42)
    case = zoo.Case("c", "uea", "JapaneseVowels", "")
    section = zoo.Section(case, "accuracy (%)", [entry("softmax", same), entry("standard", same),
                                                 entry("linear", (0.51, 0.43))], None)  # the metric ties, the loss does not
    assert zoo.identical_notes([section]) == [
        "The same results on every seed (metric and test loss), so the same model here: softmax = standard "
        "on uea/JapaneseVowels."]


def test_the_committed_zoo_report_reads_from_any_folder(workdir, capsys):
    """`report zoo/offline` outside the repository: the records and the profile of the project."""
    from bench_cli.results.provenance import PROJECT_ROOT

    main(["report", "zoo/offline", "--no-write", "--width", "300"])
    out = capsys.readouterr().out
    assert f"read {PROJECT_ROOT / 'results/reproduced/zoo/zoo.records.csv'} (" in out
    assert "profile at the LRA lengths" in out
