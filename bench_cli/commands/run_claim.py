"""The claim of `attnbench run`'s job: while it trains, no other run or sweep trains the same job
(bench_cli.results.claims), since both would train into one checkpoint folder."""
from __future__ import annotations

from contextlib import contextmanager

from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from bench_cli.core.errors import UserError
from bench_cli.core.ui import console
from bench_cli.results import claims
from bench_cli.results.job_keys import job_key


def resolved_job_config(cfg: DictConfig) -> dict:
    """The job's config (``cfg`` without its hydra node, as Hydra hands it to the job) resolved:
    the one resolution of a run (most of a config's cost), for the job key of its claim, then
    config.yaml, the record's keys and the loggers (bench_cli.results.run_folder.start_run)."""
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)


@contextmanager
def job_claimed(cfg: DictConfig, resolved: dict):
    """While `attnbench run` trains, its job is claimed in the records file as a sweep's jobs are
    (bench_cli.results.claims): two identical runs at once would train into one checkpoint folder,
    so the second is refused in one line naming the first, before anything is created. Not for a
    job without checkpoints (the runs share nothing: each writes its own folder and record) nor of
    several processes (every rank runs it: a launch's ranks share the folder by design).
    ``resolved``: the job's config resolved (:func:`resolved_job_config`)."""
    if (str(cfg.trainer.get("strategy", "none")) != "none"
            or not OmegaConf.select(cfg, "trainer.checkpoint.enabled", default=False)):
        yield
        return
    path = str(cfg.results.path)
    key = job_key(resolved)  # the key its record gets
    claimed, note = claims.claim_job(path, key, ok_rows_from=None, ttl_s=claims.claim_ttl(cfg))
    if not claimed:
        raise UserError(f"this job (job_key {key}) is already {note}, recorded in {path}: two runs of one job would "
                        f"train into one checkpoint folder; wait for it to end, or run this one without checkpoints "
                        f"(trainer.checkpoint.enabled=false)")
    if note:  # the claim of a process that is gone
        console.print(escape(note), highlight=False, soft_wrap=True)
    try:
        with claims.heartbeat(path, key):  # fresh however long the run takes (a run on another host sees it)
            yield
    finally:
        claims.release_job(path, key)
