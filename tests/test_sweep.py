"""`attnbench sweep`: Hydra multirun through the joblib launcher, resume, failures, exit status;
the experiment configs (grids, per-dataset hyperparameters as the papers print them) and the
launcher configs shipped in conf/."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench_cli.config import omegaconf_private
from bench_cli.config import compose as composition
from bench_cli.commands import sweep as sweep_command
from bench_cli.commands.sweep.plan import multirun_config
from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records
from test_plugins import plugin_dir  # noqa: F401 - fixture: the manual's plugin in a folder of its own

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "paper"


def tiny(workdir: Path) -> list[str]:
    """A few-second job on the 'Fixture' dataset. Paths are absolute: joblib's worker processes
    are reused across tests and keep the environment and cwd of the test that started them."""
    return ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
            "task.backbone.d_ff=32", "trainer.max_epochs=2", "trainer.batch_size=8", "measure.flops=false",
            "measure.memory=false", f"paths.data_root={workdir / 'data'}", f"paths.output_dir={workdir / 'outputs'}",
            f"results.path={workdir / 'res.csv'}"]


def sweep(*args: str) -> int:
    """Run `attnbench sweep` in-process; its exit status."""
    try:
        main(["sweep", *args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def rewrite(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


@pytest.mark.slow
@pytest.mark.xdist_group("loky_workers")  # joblib's worker processes, started once, serve test_sweep_progress's too
def test_joblib_sweep_resumes_what_did_not_finish(uea_fixture, workdir, capsys):
    """A joblib sweep's four jobs recorded as planned; run again, it has nothing to do; killed midway,
    only the jobs without an ok record run. (That a job that crashes is recorded with its error and
    counted in the exit status: test_sweep_progress's joblib sweep, whose first job crashes.)"""
    args = [*tiny(workdir), "model=softmax,attention_bn", "seed=0,1", "hydra/launcher=joblib_cpu"]
    planned = {j.key for j in sweep_command.plan_sweep([a for a in args if not a.startswith("hydra/")]).jobs}
    assert len(planned) == 4

    assert sweep(*args) == 0
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["job_key"] for r in rows} == planned  # the plan composes exactly what Hydra runs
    assert {(r["model"], r["seed"]) for r in rows} == {("softmax", "0"), ("softmax", "1"),
                                                       ("attention_bn", "0"), ("attention_bn", "1")}
    assert len({r["variant_key"] for r in rows}) == 2  # seeds share a variant, models do not

    # A rerun skips every finished job.
    capsys.readouterr()
    assert sweep(*args) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert len(read_records(workdir / "res.csv")) == 4

    # A sweep killed midway: one job never recorded, one recorded as failed -> only those two run.
    rows[1]["status"], rows[1]["error"] = "failed", "KeyboardInterrupt: "
    rewrite(workdir / "res.csv", [rows[0], rows[1], rows[3]])
    assert sweep(*args) == 0
    after = read_records(workdir / "res.csv")
    assert len(after) == 5
    assert {r["job_key"] for r in after[3:]} == {rows[1]["job_key"], rows[2]["job_key"]}


def test_dry_run_lists_jobs_and_runs_nothing(uea_fixture, workdir, capsys):
    assert sweep(*tiny(workdir), "model=softmax,attention_sh", "seed=0,1,2", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "6 jobs, 0 already done, 6 to run" in out
    assert not (workdir / "res.csv").exists()


def test_grid_mistakes_are_one_line_exit_2(uea_fixture, workdir, capsys):
    for args, expected in (
        (["model=softmax,no_such_model"], "unknown model 'no_such_model'"),
        (["task.dataset=Fixture,NotHere"], "NotHere"),
        (["model=softmax,attention_bn", "++model.attention.beta=0.5"], "cannot build model 'softmax'"),
        (["seed=0,1", "paths.output_dir=${nope}"], "cannot resolve its config: Interpolation key 'nope' not found"),
        (["--bogus"], "unknown option '--bogus'"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["sweep", *tiny(workdir), *args])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


# --- the plan is the run: Hydra's composition, once per job, one job_key -----------------------
@pytest.fixture
def fake_runs(monkeypatch):
    """Jobs launched for real (Hydra's basic launcher, in process) that train nothing: the runner
    gets the config the launcher composed and records an ok row with its job_key."""
    from bench_cli.results import csv_store, job_keys
    from bench_cli.engine import runner

    seen = []

    def run_experiment(cfg, run_dir, progress=None, overrides=None, run_id=None, line_prefix="", columns=None):
        seen.append(cfg)
        row = {"run_id": f"fake{len(seen)}", "status": "ok", "job_key": job_keys.job_key(cfg), "metric": "accuracy",
               "test_score": 50.0, "overrides": " ".join(overrides or ()), "output_dir": str(run_dir)}
        csv_store.append_record(cfg.results.path, row)
        return runner.RunOutcome(row)

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    return seen


def as_dict(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def test_the_planned_config_is_the_run_config_of_an_experiment_grid(uea_fixture, workdir, fake_runs, capsys):
    """Each job of an experiment's grid runs with the config the plan composed (not a second,
    different composition): equal as resolved configs, with the planned job_key."""
    args = ["experiment=primal_dual/table1", "task.dataset=Fixture", "seed=0,1", f"paths.output_dir={workdir / 'outputs'}",
            f"results.path={workdir / 'res.csv'}"]
    sweep = sweep_command.plan_sweep(args)
    assert len(sweep.jobs) == 4 * 2
    returns = sweep_command.launch(sweep, sweep.jobs)
    assert [sweep_command.error_of(r) for r in returns] == [None] * len(sweep.jobs)
    assert [as_dict(c) for c in fake_runs] == [as_dict(j.cfg) for j in sweep.jobs]
    assert [r["job_key"] for r in read_records(workdir / "res.csv")] == [j.key for j in sweep.jobs]
    assert "[sweep 8/8] ok" in capsys.readouterr().out
    # Hydra's multirun layout: multirun.yaml in the sweep folder, a folder per job with Hydra's
    # files and the job's log (hydra.job.name 'sweep', as @hydra.main named it)
    (sweep_dir,) = (workdir / "outputs" / "multirun").glob("*/*")
    assert (sweep_dir / "multirun.yaml").is_file()
    assert {p.parent.name for p in sweep_dir.glob("*/sweep.log")} == {str(i) for i in range(8)}
    assert (sweep_dir / "7" / ".hydra" / "overrides.yaml").read_text().count("seed=1") == 1


def test_a_job_composed_otherwise_than_planned_is_a_loud_error(uea_fixture, workdir, fake_runs, capsys):
    sweep = sweep_command.plan_sweep([*tiny(workdir), "seed=0,1"])
    sweep.jobs[1].key = "0" * 16  # as if the launcher's process composed another config
    errors = [sweep_command.error_of(r) for r in sweep_command.launch(sweep, sweep.jobs)]
    assert errors[0] is None and isinstance(errors[1], sweep_command.PlanMismatchError)
    assert "the plan has 0000000000000000" in str(errors[1]) and len(fake_runs) == 1  # nothing run for it


def test_job_key_is_computed_once_per_planned_job(uea_fixture, workdir, monkeypatch, capsys):
    from bench_cli.results import job_keys

    calls = []
    monkeypatch.setattr(job_keys, "job_key", lambda cfg, real=job_keys.job_key: calls.append(1) or real(cfg))
    assert sweep(*tiny(workdir), "model=softmax,attention_sh", "seed=0,1,0", "--dry-run") == 0
    assert len(calls) == 2 * 3  # one per job of the grid (seed=0 twice: one job), none to decide what is done
    assert "4 jobs, 0 already done, 4 to run" in capsys.readouterr().out


def planned_against_whole(overrides: list[str]) -> list[str]:
    """What differs, job by job, between the plan (job_composer.JobComposer: one composition per
    combination of group choices, the job's values applied to it) and Hydra composing the job whole
    (``load_sweep_config``, as a launcher does): its job_key, its config read while its values are
    set in place on the shared composition, and the config of its own. Deterministic sample: every
    job of the first and the last combination of choices is planned in order (values set and reset
    job after job: the first 20 and the last), and the first and the last of each are composed whole."""
    from omegaconf import open_dict, read_write

    from bench_cli.results import job_keys

    differences = []
    with multirun_config(overrides, None) as (app, master):
        composer, by_choices = composition.JobComposer(app, master), {}
        for job in sweep_command.job_overrides(app, master):
            by_choices.setdefault(composer.split(job)[0], []).append(tuple(job))
        combos = list(by_choices.values())
        for jobs in [combos[0], combos[-1]][:len(combos)]:
            planned = {job: sweep_command.plan_job(composer, list(job)) for job in dict.fromkeys([*jobs[:20], jobs[-1]])}
            for job in dict.fromkeys([jobs[0], jobs[-1]]):
                with composer.applied(job) as cfg:
                    shared, resolved = as_dict(cfg), composer.resolved(cfg, job)
                whole = app.compose_job(master, list(job))
                with read_write(whole), open_dict(whole):
                    del whole["hydra"]
                expected = as_dict(whole)
                differences += [f"{' '.join(job)}: {what}" for what, same in (
                    ("job_key", planned[job].key == job_keys.job_key(whole)), ("config in place", shared == expected),
                    ("config resolved in place", resolved == expected),
                    ("config of its own", as_dict(planned[job].cfg) == expected)) if not same]
    return differences


@pytest.mark.parametrize("experiment", composition.group_options("experiment"))
def test_the_plan_of_every_experiment_is_hydras_composition_of_each_job(experiment):
    assert planned_against_whole([f"experiment={experiment}"]) == []


def test_the_plan_is_hydras_composition_with_additions_deletions_nulls_and_interpolated_values():
    """Values that are not set in place (a key added with '+', a key deleted with '~', null) and
    values other keys interpolate (paths.data_root, task.dataset in experiments' per_dataset tables)."""
    assert planned_against_whole(["model=attention_bn,softmax", "seed=0,1", "+model.attention.extra=1,2",
                                  "~measure.cache", "trainer.optimizer.lr=null,0.5", "paths.data_root=/a,/b",
                                  "experiment=primal_dual/table1", "task.dataset=JapaneseVowels,Heartbeat"]) == []


def test_the_comparison_with_hydra_fails_when_a_value_is_not_applied_or_not_reset(monkeypatch):
    apply = composition.JobComposer._apply

    def without_the_last_value(cfg, values, overrides):
        return apply(cfg, values[:-1], overrides)

    with monkeypatch.context() as m:
        m.setattr(composition.JobComposer, "_apply", staticmethod(without_the_last_value))
        differences = planned_against_whole(["model=attention_bn", "seed=0,1", "trainer.max_epochs=3"])
    assert differences == [f"model=attention_bn seed={seed} trainer.max_epochs=3: {what}" for seed in (0, 1)
                           for what in ("job_key", "config in place", "config resolved in place", "config of its own")]
    # values set in place and not reset: a job without trainer.max_epochs after one with it (its
    # config in place; its job_key reads the composition's values from before any job's were set,
    # and its config of its own is copied from the composition as composed)
    def in_place(composer, job) -> tuple[dict, str]:
        key = sweep_command.plan_job(composer, job).key
        with composer.applied(job) as cfg:
            return as_dict(cfg), key

    with multirun_config([], None) as (app, master):
        composer = composition.JobComposer(app, master)
        fresh = in_place(composition.JobComposer(app, master), ["seed=1"])
        own = as_dict(sweep_command.plan_job(composer, ["seed=1"]).cfg)
        sweep_command.plan_job(composer, ["trainer.max_epochs=3", "seed=1"])
        assert in_place(composer, ["seed=1"]) == fresh and own == fresh[0]
        monkeypatch.setattr(omegaconf_private, "replaced_values", lambda cfg, values: [])  # nothing to reset
        sweep_command.plan_job(composer, ["trainer.max_epochs=3", "seed=1"])
        left, key = in_place(composer, ["seed=1"])
        assert left != fresh[0] and left["trainer"]["max_epochs"] == 3 and key == fresh[1]
        assert as_dict(sweep_command.plan_job(composer, ["seed=1"]).cfg) == own  # copied from before


def test_configs_composed_by_forked_processes_are_the_ones_composed_here(monkeypatch):
    """JobComposer.prepare shares the compositions with a forked process (the zoo's 150): what it
    composes comes back pickled, the same configs and job keys; progress counts the compositions."""
    import os
    import time

    with multirun_config(["model=softmax,linear,attention_bn,attention_sh", "seed=0,1"], None) as (app, master):
        grid = sweep_command.job_overrides(app, master)
        here, shared = composition.JobComposer(app, master), composition.JobComposer(app, master)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        compose, parent, composed_here = composition.JobComposer._base, os.getpid(), []

        def slow_here(self, choices):  # this process waits, so that the forked one composes too
            if os.getpid() == parent and choices not in self._bases:
                composed_here.append(choices)
                time.sleep(1.0)
            return compose(self, choices)

        monkeypatch.setattr(composition.JobComposer, "_base", slow_here)
        progress = []
        shared.prepare(grid, fork_from=1, progress=lambda done, total: progress.append((done, total)))
        assert len(shared._bases) == 4 and 0 < len(composed_here) < 4 and progress[-1] == (4, 4)
        monkeypatch.setattr(composition.JobComposer, "_base", compose)
        for job in grid:
            a, b = sweep_command.plan_job(shared, job), sweep_command.plan_job(here, job)
            assert a.key == b.key and as_dict(a.cfg) == as_dict(b.cfg)


def test_planning_progress_shows_after_two_seconds_then_every_five_when_redirected(monkeypatch, capsys):
    """What plan_sweep(progress=True) shows without a terminal: nothing for a plan that takes less
    than 2 s, then a line each 10% and each 5 s."""
    from types import SimpleNamespace

    from bench_cli.core import progress

    now = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    with progress.count_progress("planning the sweep", 1000, every_s=5, after_s=2) as update:
        for done, now[0] in ((1, 1.0), (2, 2.4), (3, 4.0), (4, 7.6), (100, 8.0), (1000, 9.0)):
            update(done, 1000)
    assert capsys.readouterr().err.splitlines() == [
        "planning the sweep: 0% (2/1000, 2 s)", "planning the sweep: 0% (4/1000, 8 s)",
        "planning the sweep: 10% (100/1000, 8 s)", "planning the sweep: 100% (1000/1000, 9 s)"]
    with progress.count_progress("planning the sweep", 1000, after_s=None) as update:
        now[0] = 100.0
        update(1000, 1000)
    assert capsys.readouterr().err == ""


def test_resume_runs_only_what_has_no_ok_record(uea_fixture, workdir, fake_runs, capsys):
    """A finished job (an ok record with its job_key) is skipped by the plan and never launched;
    --force launches it again. The jobs that run get the plan's numbers ([sweep 2/3])."""
    args = [*tiny(workdir), "seed=0,1,2"]
    jobs = sweep_command.plan_sweep(args).jobs
    from bench_cli.results.csv_store import append_record

    append_record(workdir / "res.csv", {"run_id": "earlier", "status": "ok", "job_key": jobs[0].key})
    append_record(workdir / "res.csv", {"run_id": "crashed", "status": "failed", "job_key": jobs[1].key})
    capsys.readouterr()
    assert sweep(*args, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "3 jobs, 1 already done, 2 to run" in out and "done, skip" in out and not fake_runs
    assert all(j.key in out for j in jobs)
    assert sweep(*args) == 0
    out = capsys.readouterr().out
    assert [int(c.seed) for c in fake_runs] == [1, 2]
    assert "[sweep 1/3] skip" in out and "(ok record earlier)" in out and "[sweep 3/3] ok" in out
    assert "sweep done" in out and "1 skipped" in out
    fake_runs.clear()
    assert sweep(*args, "--force") == 0
    assert [int(c.seed) for c in fake_runs] == [0, 1, 2]


def test_sweep_arguments_and_hydra_flags(workdir, capsys):
    assert sweep("--help") == 0 and "usage: attnbench sweep" in capsys.readouterr().out
    assert sweep("--cfg", "job", "model=attention_bn") == 0  # handed to Hydra, which prints the config
    assert "name: attention_bn" in capsys.readouterr().out
    for args, expected in ((["--resolve"], "does not apply to `attnbench sweep`"),
                           (["--config-dir", str(workdir / "nowhere")], "no such directory")):
        with pytest.raises(SystemExit) as e:
            main(["sweep", *args])
        assert e.value.code == 2 and expected in capsys.readouterr().err


# --- experiment configs -----------------------------------------------------------------------
def reference(file: str) -> list[dict]:
    with open(REFERENCE / file, newline="") as f:
        return list(csv.DictReader(f))


UEA_NAME = {"HandWriting": "Handwriting", "HeartBeat": "Heartbeat"}  # paper spelling -> archive name


def grid(*overrides: str) -> list:
    """The planned jobs (each composed by Hydra). Tests narrow the grids they compose: a job's
    composition takes a fraction of a second, and the axes they do not check are counted with
    ``sweep_command.expand_grid`` (which composes nothing but the multirun config)."""
    return sweep_command.plan_sweep(list(overrides)).jobs


def test_every_experiment_composes_and_lists_its_grid():
    exps = composition.group_options("experiment")
    assert {"primal_dual/table1", "primal_dual/table5", "primal_dual/table9", "primal_dual/table10",
            "primal_attention/uea"} <= set(exps)
    assert not [e for e in exps if "/_" in e or e.startswith("_")]  # building blocks are not options
    for exp in exps:
        cfg = composition.compose([f"experiment={exp}"])
        assert cfg.experiment_name == exp and (cfg.report.get("paper_csv") or cfg.report.get("kind") in ("zoo", "study"))


def test_table1_grid_is_the_papers_protocol_and_datasets_restrict_it():
    full = sweep_command.expand_grid(["experiment=primal_dual/table1"])
    assert len(full) == 10 * 4 * 5
    assert {o for job in full for o in job if o.startswith("seed=")} == {f"seed={s}" for s in range(5)}
    sub = sweep_command.expand_grid(["experiment=primal_dual/table1", "task.dataset=JapaneseVowels,BasicMotions"])
    assert len(sub) == 2 * 4 * 5
    assert {o for job in sub for o in job if o.startswith("task.dataset=")} == {"task.dataset=JapaneseVowels",
                                                                               "task.dataset=BasicMotions"}
    jobs = grid("experiment=primal_dual/table1", "model=softmax", "seed=0")
    assert len(jobs) == 10
    assert {j.cfg.task.protocol for j in jobs} == {"paper"} and {j.cfg.task.backbone.n_heads for j in jobs} == {8}
    # Zerveas et al.'s setup for most sets, Flowformer's for PEMS-SF / SCP2 / UWave (Appendix A.1)
    by_ds = {j.cfg.task.dataset: j.cfg for j in jobs}
    assert by_ds["JapaneseVowels"].task.backbone.d_model == 64 and by_ds["JapaneseVowels"].trainer.batch_size == 64
    assert by_ds["PEMS-SF"].task.backbone.d_model == 512 and by_ds["PEMS-SF"].trainer.max_epochs == 400
    assert by_ds["UWaveGestureLibrary"].trainer.max_epochs == 100


@pytest.mark.parametrize("table,exp", [("13", "primal_dual/table1"), ("13", "primal_dual/table9"),
                                       ("12", "primal_dual/table5"), ("12", "primal_dual/table10")])
def test_beta_per_dataset_and_model_is_the_papers_table(table, exp):
    want = {(UEA_NAME.get(r["dataset"], r["dataset"]), r["model"]): float(r["value"])
            for r in reference("primal_dual_2023.csv") if r["table"] == table and "UEA" in r["notes"]}
    axes: dict[str, set] = {}
    for job in sweep_command.expand_grid([f"experiment={exp}", "seed=0"]):
        for o in job:
            axes.setdefault(o.split("=")[0], set()).add(o)
    models = axes["model"]
    bn = sorted(m for m in models if "_bn" in m)
    jobs = grid(f"experiment={exp}", "seed=0", ",".join(bn).replace(",model=", ","))
    got = {(j.cfg.task.dataset, j.cfg.model.name): float(j.cfg.model.attention.beta) for j in jobs}
    assert len(got) == len(axes["task.dataset"]) * len(bn) and {k: want[k] for k in got} == got
    # variants without BN never see a beta (they reject unknown options)
    others = grid(f"experiment={exp}", "seed=0", "task.dataset=JapaneseVowels",
                  ",".join(sorted(models - set(bn))).replace(",model=", ","))
    assert others and all("beta" not in j.cfg.model.attention for j in others)


def test_primal_attention_uea_hyperparameters_per_dataset():
    jobs = {(j.cfg.task.dataset, j.cfg.model.name): j.cfg for j in grid("experiment=primal_attention/uea", "seed=0",
                                                                                "task.dataset=JapaneseVowels,SpokenArabicDigits,PEMS-SF")}
    pf, pp = jobs[("JapaneseVowels", "primalformer")], jobs[("JapaneseVowels", "primal_plus")]
    # published eta (run_primalformer.sh / run_primal_trans.sh), averaged over layers as the authors' loss.py
    assert (pf.model.attention.low_rank, pf.model.attention.rank_multi, pf.model.eta) == (40, 5, 0.5)
    assert (pp.model.final_attention.low_rank, pp.model.final_attention.rank_multi, pp.model.eta) == (30, 5, 0.2)
    code = {"ksvd_form": "code", "ksvd_square": "per_sample", "rows": "code", "init": "code", "padding": "ignore",
            "row_positions": "linspace"}
    for options in (pf.model.attention, pp.model.final_attention):
        assert {k: options[k] for k in code} == code
    assert pf.model.ksvd_layers == pp.model.ksvd_layers == "mean"
    backbone = pf.task.backbone
    assert (backbone.final_norm, backbone.attention_mask, backbone.attention_dropout) == (True, False, 0.1)
    assert jobs[("SpokenArabicDigits", "softmax")].trainer.optimizer.name == "adam"
    assert jobs[("PEMS-SF", "softmax")].trainer.max_epochs == 400
    assert {c.task.backbone.n_layers for c in jobs.values()} == {2}
    assert {c.task.backbone.d_model for c in jobs.values()} == {512}
    assert "eta" not in jobs[("JapaneseVowels", "softmax")].model


@pytest.mark.parametrize("launcher,target", [("joblib_cpu", "JoblibLauncher"), ("joblib", "JoblibLauncher"),
                                             ("slurm", "SlurmLauncher"), ("local", "LocalLauncher"),
                                             ("submitit_slurm", "SlurmLauncher")])
def test_launcher_configs_compose(launcher, target):
    cfg = composition.compose_unchecked([f"hydra/launcher={launcher}"], with_hydra=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    if launcher == "joblib_cpu":
        assert cfg.hydra.launcher.n_jobs == 2


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
@pytest.mark.slow
def test_killed_joblib_sweep_leaves_no_workers(uea_fixture, workdir):
    """kill -9 of a joblib_cpu sweep: its worker processes exit too (they watch their parent)."""
    import os
    import signal
    import time

    from command_processes import start_command

    args = [a for a in tiny(workdir) if not a.startswith("trainer.max_epochs")]
    log = workdir / "sweep.log"
    proc = start_command(["sweep", *args, "trainer.max_epochs=500", "seed=0,1", "hydra/launcher=joblib_cpu"], log)
    try:
        workers, deadline = [], time.time() + 120
        # both jobs are running: each worker watches the sweep before it prints its job's start
        while time.time() < deadline and log.read_text().count("start ") < 2:
            time.sleep(0.1)
        workers = [p for p in _children(proc.pid) if b"LokyProcess" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 2, log.read_text()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
        deadline = time.time() + 15
        while time.time() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "workers outlived the killed sweep"
    finally:
        for p in [proc.pid, *_children(proc.pid)]:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        proc.join()


def test_an_interrupted_jobs_dry_run_and_rerun_say_where_it_resumes(uea_fixture, workdir, monkeypatch, capsys):
    """A sweep's job stopped by SIGTERM after step 6: the dry run says where the job will resume, the
    rerun's summary that it resumed, from the epoch and step of its checkpoint."""
    from bench_cli.engine.checkpoint import position_text, read
    from test_checkpoint import UEA, interrupt_at

    args = [*UEA, f"paths.output_dir={workdir / 'outputs'}", f"results.path={workdir / 'res.csv'}"]
    with monkeypatch.context() as m:
        interrupt_at(m, 6, "SIGTERM")
        assert sweep(*args) == 143  # 128 + SIGTERM: the sweep stops with its job
    (first,) = read_records(workdir / "res.csv")
    assert first["status"] == "interrupted" and first["error"] == "interrupted (SIGTERM)"
    (checkpoint,) = Path(first["checkpoint_dir"]).glob("ckpt-*.pt")
    where = position_text(read(checkpoint)["position"])
    capsys.readouterr()
    assert sweep("--dry-run", *args) == 0
    assert f"to run, resumes at {where}" in " ".join(capsys.readouterr().out.split())
    assert sweep(*args) == 0
    out = capsys.readouterr().out
    resumed = read_records(workdir / "res.csv")[-1]
    assert resumed["status"] == "ok" and position_text({"epoch": resumed["resumed_epoch"],
                                                        "step": resumed["resumed_step"]}) == where
    assert "resumed from their checkpoints (1 jobs):" in out and f"seed=0: {where}, sitting 2 (ok)" in out


def test_a_run_signalled_after_a_sweep_in_the_same_process_leaves_later_sweeps_whole(uea_fixture, workdir, monkeypatch):
    """A sweep whose job ran in this process, then a run here stopped by SIGTERM: the run hands the
    signal to no handler of the ended sweep (which would mark that sweep stopping, and every later
    sweep of this process would start none of its jobs), and a later sweep here runs its job."""
    import os
    import signal

    from bench_cli.commands.sweep import stop
    from test_checkpoint import interrupt_at

    assert sweep(*tiny(workdir), "seed=0") == 0
    with monkeypatch.context() as m:
        interrupt_at(m, 2, "SIGTERM")
        with pytest.raises(SystemExit) as e:
            main(["run", *tiny(workdir), "seed=1"])
        assert e.value.code == 128 + signal.SIGTERM
    assert not stop._marker(os.getpid()).exists()
    assert sweep(*tiny(workdir), "seed=2") == 0
    assert [r["status"] for r in read_records(workdir / "res.csv")] == ["ok", "interrupted", "ok"]


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_sigterm_to_a_joblib_sweep_records_its_running_jobs_as_interrupted(uea_fixture, workdir, plugin_dir):  # noqa: F811
    """The sweep hands the signal to its two running jobs, which record themselves interrupted with
    it (not 'missing: no record', killed by joblib's teardown) and release their claims. (That a
    job stopped by a signal keeps its checkpoint and resumes from it: the test above.) The jobs
    train the manual's plugin attention: joblib's worker processes, fresh interpreters, import the
    plugins the config names before they build the model (a checkpoint of each job is written
    before the signal)."""
    import os
    import signal
    import time

    from command_processes import kill_if_alive, start_command
    from conftest import python_path_with

    args = [a for a in tiny(workdir) if not a.startswith("trainer.max_epochs")]
    log = workdir / "sweep.log"
    proc = start_command(["sweep", *args, "trainer.max_epochs=5000", "seed=0,1", "hydra/launcher=joblib_cpu",
                          "plugins=[mymod]", "model.attention.name=elu_linear"], log,
                         {**os.environ, "PYTHONPATH": python_path_with(plugin_dir)})
    try:
        deadline = time.monotonic() + 120
        # both jobs have trained and saved a checkpoint: their models, the plugin's attention, are built
        while len({p.parent for p in workdir.glob("checkpoints/*/ckpt-*.pt")}) < 2:
            assert proc.is_alive() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(timeout=120)
    finally:
        kill_if_alive(proc)
    out = log.read_text()
    assert proc.exitcode == 143 and "2 jobs: 2 interrupted" in out and "Traceback" not in out, out
    rows = read_records(workdir / "res.csv")
    assert sorted((r["seed"], r["status"], r["error"]) for r in rows) == [
        ("0", "interrupted", "interrupted (SIGTERM)"), ("1", "interrupted", "interrupted (SIGTERM)")]
    assert {r["attention"] for r in rows} == {"elu_linear"} and all("mymod" in r["plugins"] for r in rows)
    assert not json_claims(workdir / "res.csv.claims")  # each job released its claim


def json_claims(path: Path) -> dict:
    """The claims file of a records file (job_key -> the process that runs it); {} before the first."""
    import json

    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="forks a process")
def test_a_process_forked_while_a_sweep_launches_does_not_stop_the_sweep():
    """A data loader's worker forked by a job run in the sweep's own process inherits the sweep's
    signal handler: a SIGTERM to it (its loader ending it) ends that worker as SIGTERM would have,
    and leaves the sweep unmarked (a mark left behind would make the process's later sweeps start
    none of their jobs: "not started", no record)."""
    import signal

    from bench_cli.commands.sweep import stop

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what the worker takes: SIGTERM's default
    try:
        forked_worker_signalled(stop)
    finally:
        signal.signal(signal.SIGTERM, before)


def forked_worker_signalled(stop) -> None:
    import os
    import signal
    import time

    with stop.stopping_jobs_with_the_sweep([], [], 60.0, print):
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the forked worker: signalled while it runs Python; never back into pytest
            try:
                os.close(read)
                os.write(write, b"r")  # running: a signal before Python's after-fork reset would be lost
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                os._exit(3)
        os.close(write)
        assert os.read(read, 1) == b"r"
        os.close(read)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert not stop.stopping(os.getpid())
