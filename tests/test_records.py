"""Provenance: a record is dirty when code or configs differ from the commit, not when a report
under results/ was rewritten."""
from __future__ import annotations

import subprocess

from bench_cli.records import git_state


def test_dirty_ignores_generated_results_but_not_code(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "table.md").write_text("| a |\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    commit, dirty = git_state(tmp_path)
    assert len(commit) == 40 and dirty == "false"
    (tmp_path / "results" / "table.md").write_text("| b |\n")
    assert git_state(tmp_path)[1] == "false"
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path)[1] == "true"


def test_outside_git_is_unknown(tmp_path):
    assert git_state(tmp_path) == ("unknown", "")
