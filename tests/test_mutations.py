"""The suite still fails when the trainer, the statistics or an attention's masking is broken.

Each case copies the project's packages and tests into a temporary folder, breaks one thing in the
copy's source (an optimiser step that does nothing, the selected weights not reloaded before the
reported test evaluation, Student's pooled t in place of Welch's, the key padding mask dropped from
the attention mask, the KSVD term dropped from Primal-Attention's objective) and runs the tests that
guard it against the copy: they must fail. A guard that still passed against a broken copy would be
a test that cannot fail. The unbroken source is what the rest of the suite runs, so each guard is
known to pass there. Every copy's guards run in one process that forks a child per copy
(tests/mutants.py), so torch and Hydra are imported once.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("bench_cli", "attnbench", "tasks", "models", "conf", "tests", "pyproject.toml")

# (file, the source as it is, the broken source, the tests that must then fail)
MUTATIONS = {
    "no-op optimiser step": ("bench_cli/engine/trainer.py", "self.scaler.step(opt)", "pass  # mutated: no update",
                             ["tests/test_trainer_fit.py::test_holdout_reports_the_test_metrics_of_the_selected_weights"]),
    "selected weights not reloaded": ("bench_cli/engine/trainer.py", "self.model.load_state_dict(selection.state)",
                                      "pass  # mutated: the last weights stay",
                                      ["tests/test_trainer_fit.py::test_holdout_reports_the_test_metrics_of_the_selected_weights"]),
    "Student's t for Welch's": ("bench_cli/results/report/stats.py", "equal_var=False", "equal_var=True",
                                ["tests/test_report.py::test_welch_and_tolerance"]),
    "padding mask dropped": ("models/attention/base.py", "allowed = mask[:, None, None, :n_k]",
                             "pass  # mutated: padded keys attended",
                             ["tests/test_attention_cross.py::test_padded_context_keys_never_influence_the_output[softmax]"]),
    "KSVD term dropped": ("bench_cli/engine/objective.py", "loss = loss + self.eta * auxiliary",
                          "pass  # mutated: the task loss alone",
                          ["tests/test_primal_code.py::test_the_objective_includes_the_ksvd_term"]),
}


def broken_copy(tmp: Path, file: str, before: str, after: str) -> Path:
    # The bytecode too: a module's cached bytecode is used only while its source keeps the size and
    # modification time it was compiled from (copy2 keeps both), so each copy compiles only the file
    # it breaks instead of every module its guards import.
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp / name)
        else:
            shutil.copy2(src, tmp / name)
    target = tmp / file
    source = target.read_text()
    # the guard must know the code it breaks: a refactor that renames it fails here, not silently
    assert source.count(before) >= 1, f"{file} no longer contains {before!r}: update this mutation"
    target.write_text(source.replace(before, after))
    Path(importlib.util.cache_from_source(str(target))).unlink(missing_ok=True)  # never the unbroken bytecode
    return tmp


def test_the_guarding_tests_fail_against_each_broken_copy(tmp_path):
    spec = []
    for number, (name, (file, before, after, guards)) in enumerate(MUTATIONS.items()):
        spec.append([name, str(broken_copy(tmp_path / f"copy{number}", file, before, after)), guards])
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "mutants.py"), str(tmp_path / "spec.json")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert set(results) == set(MUTATIONS)
    for (name, copy, _), result in zip(spec, (results[name] for name, _, _ in spec)):
        assert result["where"].startswith(copy), f"{name}: the copy is not what ran: {result['where']}"
        assert result["exit"] == 1 and " failed" in result["output"], \
            f"{name}: the guarding tests passed against the broken copy (exit {result['exit']}):\n{result['output']}"
