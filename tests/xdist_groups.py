"""`--dist loadgroup` keeps the tests of one `xdist_group` in one xdist worker, on every pytest.

pytest-xdist's worker tells its controller a grouped test's group by appending `@GROUP` to the
test's node id (xdist/remote.py, `pytest_collection_modifyitems`), and it does so by assigning
`item._nodeid`. pytest 9.2 keeps node ids structured (`item._id`, a `_pytest.nodeid.NodeId`) and no
longer reads `_nodeid`, so with pytest-xdist 3.8 the suffix is silently lost and every grouped test
is scheduled on its own, on any worker (pytest-dev/pytest-xdist#1386; the fix, #1388, is not
released). The groups are what a worker pays once for: the joblib worker processes of the in-process
joblib sweeps, the manual's commands (tests/test_docs_commands.py), transformers' import
(tests/test_bench_reference.py).

This is the suite's only use of pytest's private node id, fenced here: after xdist's own hook, a
grouped test whose id lacks its suffix gets it in the structured id. Where xdist wrote it (an older
pytest, or an xdist with the fix), nothing is changed. tests/test_xdist_groups.py fails when the
suffix is missing from a grouped test's id in a `--dist loadgroup` worker."""
from __future__ import annotations

import pytest


def group_names(item: pytest.Item) -> list[str]:
    """The item's xdist groups, sorted, as xdist names them (a mark without a name is 'default')."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return sorted(names)


def has_group_suffix(nodeid: str) -> bool:
    """xdist's own test for a suffix (xdist/scheduler/loadgroup.py `_split_scope`): an '@' after the
    parameters' closing bracket, so that an '@' inside a parameter is not taken for one."""
    return nodeid.rfind("@") > nodeid.rfind("]")


def restore_group_suffixes(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Append `@GROUP` (several: joined by '_', as xdist joins them) to the id of each grouped item
    that lacks it, in a worker of a `--dist loadgroup` run (xdist sets `config.option.loadgroup`
    there); elsewhere nothing."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = group_names(item)
        if not names or has_group_suffix(item.nodeid):
            continue
        suffixed = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):  # pytest >= 9.2: the structured id, which keeps the string it was parsed from
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(suffixed)
        else:
            item._nodeid = suffixed
