"""What a sweep says about the jobs that continue from a checkpoint (an interrupted sweep run
again): its dry run says where each job to run will resume, and its summary which jobs resumed
and from where, so that nobody has to read the jobs' logs to know whether work was saved."""
from __future__ import annotations

from bench_cli.engine.checkpoint import position_text, resume_point


def resume_note(job) -> str:
    """', resumes at epoch 3, step 15' for a planned job with a checkpoint to continue from, else ''."""
    with job.reading() as cfg:
        point = resume_point(cfg, job.key)
    return f", resumes at {point}" if point else ""


def resumed_lines(outcomes) -> list[str]:
    """One line per job whose record (written by this sweep) continued a checkpoint: its label,
    the epoch and step it resumed at and its sitting. ``outcomes``: (job, status, record) triples."""
    resumed = [(job, record) for job, status, record in outcomes
               if status != "skipped" and record and record.get("resumed_from")]
    if not resumed:
        return []
    return [f"resumed from their checkpoints ({len(resumed)} jobs):"] + [
        f"  {job.label}: {position_text({'epoch': r.get('resumed_epoch'), 'step': r.get('resumed_step')})}, "
        f"sitting {r.get('sittings')} ({r.get('status')})" for job, r in resumed]
