"""`attnbench sweep hydra/sweeper=optuna`: a hyperparameter search, every trial a job of the sweep.

The sweep's overrides (``hydra.sweeper.params``, then the command line) are read as Hydra's Optuna
sweeper reads them, in two parts (sweep.split_search): what Optuna samples (``interval(0,0.3)``,
``tag(log, interval(1e-4,1e-2))``, ``choice()``, ``range()``: Optuna distributions made by the
plugin's own function) and the rest, whose comma lists make a grid of studies, each searched alike
(``model=softmax,attention_bn``: each attention tuned with as many trials, a fair comparison).

One study per job of that grid, named ``<study_name, else experiment_name, else 'sweep'>: <job
label> <job_key>`` (the job's config without the sampled values: another fixed setting is another
study), stored in ``hydra.sweeper.storage`` (default ``sqlite:///<results.path>.optuna.db``, beside
the records). A study runs until it holds ``hydra.sweeper.n_trials`` trials: the same command again
continues it, a larger n_trials adds the difference. Trials are asked ``hydra.sweeper.n_jobs`` at a
time and launched as a batch of the sweep (the config's launcher, claims, checkpoints; one record
each, with the study's name and the trial's number: schema.STUDY_COLUMNS).

The objective is the record's ``val_score``: the task's selection metric on the validation split
carved from TRAIN (protocol holdout; a config whose protocol selects on TEST is refused), in the
metric's direction (the task says it: a ``hydra.sweeper.direction`` given against it is refused). The test split is
evaluated with the selected weights and recorded, never told to Optuna. A trial that diverged
(status nan) is pruned (the sampler takes it as the worst), one that crashed (failed, oom, timeout)
failed; both are recorded and the study goes on. A trial whose job left no record (a sweep killed,
a job another process holds) stays running and is run again when the study continues (its job
resumes from its checkpoint). Values sampled again (a small ``choice()`` space) reuse the job's ok
record instead of training again.
"""
from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.commands.sweep import (MAX_EXIT, Job, Sweep, done_keys, error_of, launch, plan_job, split_search,
                                      start_launching, sweep_lines, validate_jobs)
from bench_cli.commands.study_confirm import confirm_best
from bench_cli.core.errors import UserError, exit_code_of, interruption_name
from bench_cli.core.extras import require
from bench_cli.engine.pruning import PRUNING
from bench_cli.results import csv_store

EXTRA = "tune"  # pyproject.toml's extra that installs hydra-optuna-sweeper (and optuna)
SQLITE = "sqlite:///"  # the default storage's scheme: a file beside the records


@dataclass
class Study:
    """One study of the sweep: its job without the sampled values (``base``), where it is kept and
    what it maximises or minimises."""
    base: Job
    name: str
    storage: str
    metric: str
    direction: str  # 'maximize' | 'minimize'


def optuna():
    """The optuna module, quiet (its INFO lines would repeat the sweep's own)."""
    module = require("optuna", EXTRA, "hydra/sweeper=optuna")
    module.logging.set_verbosity(module.logging.WARNING)
    warnings.filterwarnings("ignore", category=module.exceptions.ExperimentalWarning)
    return module


def search_space(master: DictConfig) -> dict:
    """{key: Optuna distribution} of the overrides Optuna samples (hydra-optuna-sweeper's reading)."""
    optuna()  # the plugin's reading imports it
    from bench_cli.config.hydra_private import optuna_distribution

    _, searched = split_search(sweep_lines(master))
    space = {}
    for key, o in searched.items():
        try:
            space[key] = optuna_distribution(o)
        except (AssertionError, ValueError, NotImplementedError) as e:
            raise UserError(f"'{o.input_line}': Optuna cannot sample it ({e or 'not a distribution'})") from None
    if not space:
        raise UserError("hydra/sweeper=optuna: nothing to search; give a search space, e.g. "
                        "'trainer.optimizer.lr=tag(log, interval(1e-4,1e-2))' 'task.backbone.dropout=interval(0,0.3)'")
    return space


def study_of(job: Job, master: DictConfig) -> Study:
    """The study a job of the grid names: its name, storage, metric and direction."""
    from bench_cli.config.taskfit import build_task

    with job.reading() as cfg:
        protocol = str(OmegaConf.select(cfg, "task.protocol", default="holdout"))
        if protocol != "holdout":
            raise UserError(f"job '{' '.join(job.overrides)}': protocol {protocol} selects on the test split; an Optuna "
                            "sweep selects on validation: task.protocol=holdout")
        metric = build_task(cfg).selection_metric()
        base = (OmegaConf.select(master, "hydra.sweeper.study_name", default=None)
                or OmegaConf.select(cfg, "experiment_name", default=None) or "sweep")
    storage = (OmegaConf.select(master, "hydra.sweeper.storage", default=None)
               or f"{SQLITE}{Path(job.records_path).resolve()}.optuna.db")
    return Study(job, f"{base}: {job.label} {job.key}", str(storage), metric.name,
                 "maximize" if metric.higher_is_better else "minimize")


def sampler(master: DictConfig, finished: int):
    """``hydra.sweeper.sampler`` (TPE by default). A seeded sampler is seeded anew per sitting
    (seed + trials already in the study), so a continued study does not propose its first values again."""
    from hydra.utils import instantiate

    node = OmegaConf.to_container(master.hydra.sweeper.sampler, resolve=True)
    if node.get("_partial_"):
        raise UserError("hydra/sweeper/sampler=grid: a grid is `attnbench sweep` without hydra/sweeper=optuna")
    if node.get("seed") is not None:
        node["seed"] = int(node["seed"]) + finished
    return instantiate(node)


def sqlite_file(study: Study) -> Path | None:
    """The file of a ``sqlite:///`` storage (the default), None for another database."""
    return Path(study.storage[len(SQLITE):]) if study.storage.startswith(SQLITE) else None


def stored_trials(study: Study) -> list | None:
    """The study's trials, without creating its storage (a dry run); None when it has none yet. A
    storage that is not a study database (garbage bytes, another program's database, a folder) or
    cannot be written is one line naming it, before any trial runs."""
    from bench_cli.core.files import unwritable_folder

    opt = optuna()
    path = sqlite_file(study)
    if path is not None:
        if path.exists() and not path.is_file():
            raise UserError(f"study storage {path} is not a file; choose another hydra.sweeper.storage")
        blocked = unwritable_folder(path.parent)
        if blocked is not None:
            raise UserError(f"study storage {path}: cannot write in {blocked}; choose another hydra.sweeper.storage "
                            "(or results.path)")
        if not path.is_file():
            return None
    try:
        return opt.load_study(study_name=study.name, storage=study.storage).trials
    except KeyError:
        return None
    except Exception as e:  # noqa: BLE001 - sqlalchemy's and optuna's errors of a database they cannot use
        from bench_cli.core.errors import first_line

        raise UserError(f"study storage {study.storage} cannot be used as an Optuna database ({type(e).__name__}: "
                        f"{first_line(e)[:160]}): move it aside, or choose another hydra.sweeper.storage") from None


def open_study(study: Study, master: DictConfig):
    opt = optuna()
    existing = stored_trials(study) or []
    if sqlite_file(study) is not None:  # beside a records file that may not exist yet
        sqlite_file(study).parent.mkdir(parents=True, exist_ok=True)
    return opt.create_study(study_name=study.name, storage=study.storage, direction=study.direction,
                            sampler=sampler(master, len(existing)), load_if_exists=True)


@contextmanager
def asking(study: Study):
    """Held while a sitting counts the study's trials and asks for more: two sweeps of the same
    study at once (two terminals, two Slurm jobs) then never ask beyond ``n_trials`` between
    them. A lock file beside a sqlite storage (``<file>.lock``); another database has no file to
    lock, and a trial asked beyond the count there is failed unrun (``run_study``)."""
    import fcntl
    import os

    path = sqlite_file(study)
    if path is None:
        yield
        return
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o666)  # a lock, never content: empty
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, or when the process dies
        yield
    finally:
        os.close(lock)


def counts(trials) -> str:
    """'3 complete, 1 pruned' of a study's trials."""
    states: dict[str, int] = {}
    for t in trials:
        states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    return ", ".join(f"{n} {s}" for s, n in states.items()) or "no trials"


def best_text(study) -> str:
    try:
        best = study.best_trial
    except ValueError:  # no complete trial
        return "no complete trial"
    return f"best trial {best.number}: {best.value:.6g} ({' '.join(f'{k}={v:.6g}' if isinstance(v, float) else f'{k}={v}' for k, v in best.params.items())})"


class SearchProgress:
    """The search's overall line after each batch of trials, as a sweep's (sweep.progress.Counts):
    trials complete, failed (or pruned) and to go over every study, the ETA from the time per
    trial run in this sitting (trials a resumed study holds already cost nothing)."""

    def __init__(self, total: int):
        from bench_cli.commands.sweep.progress import Counts

        self.total, self.started, self.ran = total, time.monotonic(), 0
        self.searched = Counts(0)  # the trials of the studies searched to the end

    @staticmethod
    def split(trials) -> tuple[int, int]:
        """(complete, failed or pruned) of a study's trials; running ones are neither."""
        states = [t.state.name for t in trials]
        return states.count("COMPLETE"), states.count("FAIL") + states.count("PRUNED")

    def after_batch(self, study, ran: int) -> None:
        from bench_cli.commands.sweep.progress import Counts
        from bench_cli.core.ui import console

        self.ran += ran
        done, failed = self.split(study.trials)
        now = Counts(self.total, self.searched.done + done, self.searched.failed + failed)
        elapsed = time.monotonic() - self.started
        now.eta_s = elapsed / self.ran * now.to_go if self.ran else None
        console.print(f"search progress: {now.text(elapsed)}", highlight=False, markup=False, soft_wrap=True)

    def study_searched(self, study) -> None:
        done, failed = self.split(study.trials)
        self.searched.done, self.searched.failed = self.searched.done + done, self.searched.failed + failed


# --- the sweep --------------------------------------------------------------------------------
def run_studies(sweep: Sweep, dry_run: bool) -> None:
    """The command's Optuna part: every study of the plan, one after the other; exits with the
    number of studies left without a complete trial (a search whose every trial failed)."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    master = sweep.master
    space = search_space(master)
    n_trials = whole_number(master.hydra.sweeper.get("n_trials"), "hydra.sweeper.n_trials")
    batch = whole_number(master.hydra.sweeper.get("n_jobs") or 1, "hydra.sweeper.n_jobs")
    validate_jobs(sweep.jobs, missing_data_ok=dry_run)
    studies = [study_of(job, master) for job in sweep.jobs]
    for s in studies:  # every study's storage usable before any trial trains
        stored_trials(s)
    given = [o.split("=", 1)[1] for o in master.hydra.overrides.hydra if o.startswith("hydra.sweeper.direction=")]
    for s in studies if given else []:  # the task says it; a contrary wish is a mistake, not a setting
        if given[-1] != s.direction:
            raise UserError(f"hydra.sweeper.direction={given[-1]}: the objective is the validation {s.metric}, which "
                            f"the task {'maximizes' if s.direction == 'maximize' else 'minimizes'}; leave the direction out")
    console.print(f"[bold]Optuna[/]: {len(studies)} stud{'ies' if len(studies) > 1 else 'y'} of {n_trials} trials, "
                  f"searching {', '.join(space)}; objective: the validation {studies[0].metric} "
                  f"({studies[0].direction}); storage: {studies[0].storage}", highlight=False, soft_wrap=True)
    if dry_run:
        for s in studies:
            trials = stored_trials(s) or []
            console.print(f"  {escape(s.name)}: {counts(trials)}; {max(0, n_trials - len(trials))} to ask",
                          highlight=False, soft_wrap=True)
        return
    start_launching()
    launched, empty, progress = 0, 0, SearchProgress(n_trials * len(studies))
    for s in studies:
        try:
            launched, study = run_study(sweep, s, space, n_trials, batch, launched, progress)
        except KeyboardInterrupt as e:
            console.print(f"[red]interrupted[/] ({interruption_name(e)}): rerun the same command to continue the "
                          "studies (a trial cut short resumes from its checkpoint)")
            raise SystemExit(exit_code_of(e)) from None
        console.print(f"[bold]study[/] {escape(s.name)}: {counts(study.trials)}; {escape(best_text(study))}",
                      highlight=False, soft_wrap=True)
        progress.study_searched(study)
        empty += not any(t.state.name == "COMPLETE" for t in study.trials)
        launched = confirm_best(sweep, s, study, space, launched)  # tuning.confirm_top: the best settings over seeds
    if empty:
        raise SystemExit(min(empty, MAX_EXIT))


def whole_number(value, key: str) -> int:
    """A count of the search (trials, trials at a time): a whole number of at least 1, else one line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{key}={value}: expected a whole number of at least 1")
    return value


def trial_job(composer, s: Study, trial, space: dict) -> Job:
    """The trial's job: the study's overrides and the values Optuna gave it."""
    values = [f"{k}={trial.params[k]}" for k in space if k in trial.params]
    job = plan_job(composer, [*s.base.overrides, *values])
    job.swept = s.base.swept | frozenset(k.lstrip("+~") for k in space)
    job.position, job.columns = trial.number, {"study": s.name, "trial": trial.number}
    pruner = trial_pruner(s, trial, job)
    if pruner:  # the trial's run reports its validation curve; the study's median pruner may stop it
        job.columns[PRUNING] = pruner
    return job


def trial_pruner(s: Study, trial, job: Job) -> dict | None:
    """What the trial's run needs to report to the study and be pruned (bench_cli/engine/pruning.py),
    from ``tuning.pruner`` (``median`` or ``none``) of the trial's config; None: not pruned."""
    with job.reading() as cfg:
        kind = str(OmegaConf.select(cfg, "tuning.pruner", default="none") or "none")
        if kind == "none":
            return None
        if kind != "median":
            raise UserError(f"tuning.pruner={kind}: expected median or none")
        return {"storage": s.storage, "study": s.name, "trial_id": trial._trial_id, "metric": s.metric,
                "startup_trials": int(OmegaConf.select(cfg, "tuning.pruner_startup_trials", default=5)),
                "warmup_steps": int(OmegaConf.select(cfg, "tuning.pruner_warmup_steps", default=0))}


def run_study(sweep: Sweep, s: Study, space: dict, n_trials: int, batch: int, launched: int,
              progress: SearchProgress):
    """Ask, run and tell until the study holds ``n_trials`` trials (those a killed sweep left
    running first), the search's progress said after each batch; (jobs launched in the sweep
    folder so far, the study)."""
    opt = optuna()
    study = open_study(s, sweep.master)
    left = [t for t in study.trials if t.state == opt.trial.TrialState.RUNNING]
    composer = s.base.composer
    while True:
        trials = left[:batch]
        left = left[batch:]
        with asking(s):  # counted afresh each time: another sweep of the study may have asked meanwhile
            while len(trials) < batch and len(study.trials) < n_trials:
                trial = study.ask(fixed_distributions=space)
                if trial.number >= n_trials:  # another process asked between the count and this ask
                    study.tell(trial.number, state=opt.trial.TrialState.FAIL)
                    break
                trials.append(trial)
        if not trials:
            break
        ran = run_trials(sweep, study, s, [(t, trial_job(composer, s, t, space)) for t in trials], n_trials, launched)
        launched += ran
        progress.after_batch(study, ran)
    return launched, study


def run_trials(sweep: Sweep, study, s: Study, planned: list, n_trials: int, launched: int) -> int:
    """Run a batch of trials (their jobs with the sweep's launcher) and tell Optuna each one's
    outcome from its record; the number of jobs launched."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    path = s.base.records_path
    done = done_keys(path)
    todo = []
    for trial, job in planned:
        if job.key in done:  # values sampled again: the job's ok record answers
            console.print(f"[trial {trial.number}] {escape(job.label)}: done before (ok record "
                          f"{done[job.key].get('run_id', '')})", highlight=False, soft_wrap=True)
            continue
        try:
            validate_jobs([job])
        except UserError as e:  # a sampled value the config refuses: this trial fails, the study goes on
            tell(study, trial, None, str(e))
            console.print(f"[trial {trial.number}] [red]failed[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            continue
        todo.append(job)
    before = len(csv_store.read_records(path))
    started = time.perf_counter()
    returns = launch(Sweep(sweep.master, todo, sweep.flags, total=n_trials), todo, first_job_idx=launched) if todo else []
    for e in filter(None, map(error_of, returns)):  # a job that failed outside its run
        console.print(f"[bold red]error:[/] {escape(type(e).__name__)}: {escape(str(e))}", highlight=False, soft_wrap=True)
    new = {r.get("job_key"): r for r in csv_store.read_records(path)[before:]}
    ran = {j.key for j in todo}
    for trial, job in planned:
        row = new.get(job.key) or done.get(job.key)
        if row is not None or job.key in ran:
            tell(study, trial, row, None)
    if todo:
        console.print(f"[dim]{len(todo)} trial(s) in {time.perf_counter() - started:.0f} s; {escape(best_text(study))}[/]",
                      highlight=False, soft_wrap=True)
    return len(todo)


def objective(row: dict) -> float | None:
    """The value Optuna is told: the record's validation score (never a test column)."""
    try:
        value = float(row.get("val_score"))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def tell(study, trial, row: dict | None, refused: str | None) -> None:
    """Tell Optuna how the trial's job ended: ok -> complete with its validation score; nan ->
    pruned, as is pruned (the median pruner stopped it); failed, oom, timeout or refused -> failed; interrupted or no record -> left running
    (the next sitting runs it again)."""
    opt = optuna()
    states = opt.trial.TrialState
    status = (row or {}).get("status") or ("failed" if refused else None)
    number = trial.number
    if status in (None, "interrupted"):
        return
    value = objective(row) if status == "ok" else None
    if status == "ok" and value is not None:
        study.tell(number, value)
    elif status in ("nan", "pruned"):  # diverged, or stopped by the pruner on its validation curve
        study.tell(number, state=states.PRUNED)
    else:
        study.tell(number, state=states.FAIL)
