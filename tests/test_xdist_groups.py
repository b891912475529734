"""The suite's xdist groups take effect (tests/xdist_groups.py): a grouped test's id carries its
group in a `--dist loadgroup` worker, which is how xdist's controller keeps a group in one worker."""
from __future__ import annotations

import pytest
from types import SimpleNamespace

import xdist_groups


@pytest.mark.xdist_group("manual_commands")  # a group of the suite's, so this costs no extra unit of work
def test_a_grouped_test_carries_its_group_under_loadgroup(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a --dist loadgroup worker (make test runs one)")
    assert request.node.nodeid.endswith("@manual_commands"), request.node.nodeid


class Item:
    """What restore_group_suffixes reads and writes of a pytest item."""

    def __init__(self, nodeid, *groups):
        from _pytest.nodeid import NodeId

        self._id = NodeId.parse(nodeid)
        self.marks = [pytest.mark.xdist_group(g).mark for g in groups]

    @property
    def nodeid(self):
        return str(self._id)

    def iter_markers(self, name):
        return [m for m in self.marks if m.name == name]


def test_suffixes_are_added_once_and_only_to_grouped_tests_under_loadgroup():
    items = [Item("tests/a.py::test_x[p@q]", "g"), Item("tests/a.py::test_y"), Item("tests/a.py::test_z@g", "g"),
             Item("tests/a.py::test_w", "b", "a")]
    xdist_groups.restore_group_suffixes(SimpleNamespace(option=SimpleNamespace(loadgroup=False)), items)
    assert [i.nodeid for i in items] == ["tests/a.py::test_x[p@q]", "tests/a.py::test_y", "tests/a.py::test_z@g",
                                         "tests/a.py::test_w"]
    xdist_groups.restore_group_suffixes(SimpleNamespace(option=SimpleNamespace(loadgroup=True)), items)
    assert [i.nodeid for i in items] == ["tests/a.py::test_x[p@q]@g", "tests/a.py::test_y", "tests/a.py::test_z@g",
                                         "tests/a.py::test_w@a_b"]
