"""Commands that answer at once (a user waits on them): `--help`, `ls` and a misspelt override import neither
torch nor Hydra, and what they read instead of the torch registries (bench_cli/config/catalog_table.py,
the YAML read without Hydra) stays equal to what the registries and Hydra say. The times
themselves are a benchmark (`attnbench bench-cli`), not a test."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from bench_cli.config import catalog, checks
from bench_cli.config import compose
from bench_cli.commands.cli import main
from bench_cli.core.errors import UserError

# Runs each command of argv lists (JSON) in one fresh process and prints, after each, whether
# torch and Hydra have been imported by then.
PROBE = """
import json, sys
sys.argv = ["attnbench"]
import bench_cli.commands.cli
flags = [["import bench_cli.commands.cli", "torch" in sys.modules, "hydra" in sys.modules]]
for args in json.loads(sys.argv_json):
    try:
        bench_cli.commands.cli.main(args)
    except SystemExit:
        pass
    flags.append([" ".join(args), "torch" in sys.modules, "hydra" in sys.modules])
print("FLAGS " + json.dumps(flags))
"""

QUICK = [["--help"], ["run", "--help"], ["bench", "--help"], ["ls", "models"], ["ls"], ["ls", "tasks"], ["ls", "experiments"],
         ["run", "modle=softmax"], ["run", "task=uae"], ["run", "records.path=x"]]


def import_flags(commands: list[list[str]]) -> tuple[list, subprocess.CompletedProcess]:
    """PROBE's flags for ``commands`` run in one fresh process, and the process."""
    code = PROBE.replace("sys.argv_json", repr(json.dumps(commands)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next(x for x in r.stdout.splitlines() if x.startswith("FLAGS "))
    return json.loads(line[len("FLAGS "):]), r


def test_help_ls_and_misspelt_overrides_import_neither_torch_nor_hydra(workdir):
    flags, r = import_flags(QUICK)
    assert [f[0] for f in flags] == ["import bench_cli.commands.cli", *(" ".join(a) for a in QUICK)], r.stderr
    assert [f[0] for f in flags if f[1]] == [], "imported torch"
    assert [f[0] for f in flags if f[2]] == [], "imported Hydra"
    assert "unknown config key 'modle' (did you mean 'model'?)" in r.stderr
    assert "unknown task 'uae' (did you mean 'uea'?)" in r.stderr
    assert "unknown config key 'records.path'" in r.stderr and ", results, seed," in r.stderr  # the valid keys


def test_protocols_are_torch_free_and_the_task_contracts():
    """The records' schema reads the protocols from bench_cli/core/protocols.py, which imports no torch."""
    code = "import sys, bench_cli.core.protocols; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
    from bench_cli.core import protocols, task

    assert (task.Protocol, task.PROTOCOL_SPLITS, task.PROTOCOLS, task.PAPER_SELECTIONS) == \
        (protocols.Protocol, protocols.PROTOCOL_SPLITS, protocols.PROTOCOLS, protocols.PAPER_SELECTIONS)


def test_ls_runs_imports_no_torch(workdir):
    flags, r = import_flags([["ls", "runs"]])
    assert flags[-1] == ["ls runs", False, False], r.stderr


def test_catalog_table_equals_the_live_registries():
    from bench_cli.config import catalog_table

    hint = "the registries changed: run `python -m bench_cli.config.catalog` to rewrite bench_cli/config/catalog_table.py"
    assert catalog.table_attentions() == catalog.live_attentions(builtin_only=True), hint
    assert catalog_table.TASKS == catalog.live_tasks(builtin_only=True), hint


@pytest.mark.parametrize("section", ["models", "tasks", "summary"])
def test_ls_from_the_table_prints_what_the_live_registries_print(section, workdir, capsys, monkeypatch):
    args = ["ls"] if section == "summary" else ["ls", section]
    outputs = []
    for live in (True, False):
        monkeypatch.setattr(catalog, "_live", lambda live=live: live)
        main(args)
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert ("softmax" if section != "tasks" else "lra_listops") in outputs[0]


def test_listing_config_equals_the_composed_one(workdir, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_DATA", str(workdir / "elsewhere"))
    light, full = compose.compose_for_listing([]), compose.compose([])
    for key in ("paths", "plugins"):
        assert OmegaConf.to_container(light[key], resolve=True) == OmegaConf.to_container(full[key], resolve=True)
    assert light.paths.data_root == str(workdir / "elsewhere")


def test_option_data_reads_the_attentions_load_option_reads():
    for model in compose.group_options("model"):
        fast, slow = compose.option_data("model", model), compose.load_option("model", model)
        assert fast["attention"]["name"] == slow.attention.name, model
        assert bool(fast.get("final_attention")) == bool(slow.get("final_attention")), model


def test_quick_check_says_what_hydra_says(workdir, monkeypatch):
    def message(*overrides: str) -> str:
        with pytest.raises(UserError) as e:
            compose.compose(list(overrides))
        return str(e.value)

    quick = message("modle=softmax"), message("task=uae")
    monkeypatch.setattr(checks, "quick_check", lambda overrides: None)
    assert (message("modle=softmax"), message("task=uae")) == quick


def test_top_level_keys_hold_every_composed_key(workdir):
    keys = compose.top_level_keys()
    for overrides in ([], ["experiment=primal_dual/table1"], ["experiment=primal_attention/lra"]):
        assert set(compose.compose(overrides, with_hydra=True).keys()) <= keys, overrides
