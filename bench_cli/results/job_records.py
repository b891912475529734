"""Which record of a job counts: its latest ``ok`` row.

One job can have several ok rows in a records file (two sweeps of one file at once, a ``--force``
rerun, two `attnbench run` of one config one after the other). A sweep's resume, a job's claim and
every report count the job once, with the latest of them: :func:`latest_ok_per_job` is that rule,
:func:`one_row_per_job` the rows a report counts."""
from __future__ import annotations


def latest_ok_per_job(rows: list[dict]) -> dict[str, dict]:
    """job_key -> the latest ``ok`` row of that job, in file order (a row without a job key is no
    job's)."""
    return {key: rows[i] for key, i in _latest_ok_index(rows).items()}


def one_row_per_job(rows: list[dict]) -> tuple[list[dict], int]:
    """(rows, number of rows dropped): of the ``ok`` rows that share a ``job_key`` only the latest
    stays (:func:`latest_ok_per_job`), so no seed counts twice; rows that are not ``ok`` all stay,
    in their order."""
    latest = set(_latest_ok_index(rows).values())
    kept = [r for i, r in enumerate(rows) if i in latest or not _is_ok_of_a_job(r)]
    return kept, len(rows) - len(kept)


def _latest_ok_index(rows: list[dict]) -> dict[str, int]:
    return {r["job_key"]: i for i, r in enumerate(rows) if _is_ok_of_a_job(r)}


def _is_ok_of_a_job(row: dict) -> bool:
    return row.get("status") == "ok" and bool(row.get("job_key"))
