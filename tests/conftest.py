"""Shared fixtures: an isolated working directory, data root and results file for every test
that runs the CLI, and writers of small `.ts` files in the real UEA format."""
from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
from pathlib import Path

# One intra-op thread in every test process and in every process a test starts (the CLI, sweep
# workers): the suite runs one worker per core (pytest-xdist), and two threads per worker on a
# 2-core machine made the tiny models several times slower (OpenMP threads waiting on each other).
# Set before torch is imported, so its thread pool starts at that size.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


def pytest_collection_finish(session):
    """Once the tests are collected, what is in memory (torch, Hydra, the test modules: hundreds of
    thousands of objects) is moved out of the garbage collector's reach (gc.freeze), and a young
    collection waits for 50,000 new objects instead of 700: the collector's full passes over those
    objects were a tenth of the time of the config and sweep tests. Objects made by the tests are
    still collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


@pytest.hookimpl(trylast=True)  # after xdist's own hook, whose suffix pytest 9.2 no longer reads
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` keeps each xdist_group in one worker (tests/xdist_groups.py says why this
    is needed)."""
    import xdist_groups

    xdist_groups.restore_group_suffixes(config, items)


def pytest_configure(config):
    """The limit on one test's time and the per-test CPU record (tests/durations.py); an interrupted
    run stops its workers and what they started (tests/interruption.py)."""
    import durations
    import interruption

    durations.install(config)
    interruption.install(config)


ATTNBENCH = Path(sys.executable).with_name("attnbench")  # the console script, as a user runs it


def attnbench(*args: str, env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run the console script in its own process (output captured, text). Used where the command
    must be seen as a user sees it, and to keep services such as wandb's out of the test process."""
    return subprocess.run([str(ATTNBENCH), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kw)


# The CLI's commands (a JSON list of argument lists, argv[1]) one after the other in one process, each
# followed by its exit status on stdout and the separator (argv[2]) on both streams.
COMMANDS_MAIN = """
import json, sys
from bench_cli.commands.cli import main
for args in json.loads(sys.argv[1]):
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    print("exit status", code, flush=True)
    for stream in (sys.stdout, sys.stderr):
        print(sys.argv[2], file=stream, flush=True)
"""
SEPARATOR = "--- the next command ---"


def commands_in_one_process(commands: list[list[str]], prelude: str = "", env: dict | None = None,
                            timeout: float = 120, **kw) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of each of ``commands`` run one after the other in one fresh
    process, after ``prelude`` (code run before the CLI is imported). For what only a fresh
    interpreter shows (its imports), where a process per command would cost seconds of imports each."""
    import json

    done = subprocess.run([sys.executable, "-c", prelude + COMMANDS_MAIN, json.dumps(commands), SEPARATOR],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, **kw)
    outs, errs = done.stdout.split(SEPARATOR + "\n"), done.stderr.split(SEPARATOR + "\n")
    assert done.returncode == 0 and len(outs) == len(errs) == len(commands) + 1, done.stdout + done.stderr
    results = []
    for out, err in zip(outs[:-1], errs[:-1]):  # after the last separator: nothing
        *lines, status = out.rstrip("\n").splitlines()
        results.append((int(status.removeprefix("exit status ")), "\n".join(lines), err))
    return results


def python_path_with(folder) -> str:
    """PYTHONPATH with ``folder`` first and the one this process was given after it (the checkout
    under test stays importable in the child)."""
    return os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])


def causal_models(decoder_layers: int) -> list[str]:
    """The model presets that can serve as a causal decoder of ``decoder_layers`` layers (test_lm's
    and test_d4rl's parametrisations, computed while collecting)."""
    from attnbench.models.roles import capability_problems

    return [name for name, model in composed_models().items()
            if not capability_problems(model, {"decoder": decoder_layers})]


def with_model(cfg, model: str):
    """A copy of the composed ``cfg`` with the model group's option ``model`` put in its place, as
    loaded: what Hydra composes with ``model=...`` added to cfg's overrides
    (test_configs.test_model_options_compose_as_loaded checks every option), for a fraction of a
    composition's cost. The copy is unpickled (bench_cli.config.kept_config: OmegaConf's own round
    trip), from the pickle ``composed`` keeps of its compositions: 1.5 ms, where a deep copy of a
    composed config took 16 ms, for the 390 task x model presets among others."""
    from omegaconf import open_dict

    from bench_cli.config.compose import load_option
    from bench_cli.config.kept_config import KeptConfig

    entry = _KEPT_COMPOSITIONS.get(id(cfg))
    cfg = (entry[1] if entry is not None and entry[0] is cfg else KeptConfig(cfg)).copy()
    with open_dict(cfg):
        cfg.model = load_option("model", model)
    return cfg


# id of each composition ``composed`` handed out -> (it, a KeptConfig of it): the compositions live as
# long as composed's cache, and their callers do not change them
_KEPT_COMPOSITIONS: dict[int, tuple] = {}


@functools.cache
def composed(overrides: tuple[str, ...]):
    """``overrides`` composed once per test process (callers copy before they change it:
    ``with_model``'s copies are unpickled from a pickle taken here)."""
    from bench_cli.config.compose import compose
    from bench_cli.config.kept_config import KeptConfig

    cfg = compose(list(overrides))
    _KEPT_COMPOSITIONS[id(cfg)] = (cfg, KeptConfig(cfg))
    return cfg


def causal_config(overrides: tuple[str, ...], model: str, dataset: str):
    """What Hydra composes for ``overrides`` with ``model=<model>`` and
    ``+per_dataset.data_dependent.<model>.<dataset>=false`` (a causal Primal-Attention takes
    data-independent weights, Listing 1), from one composition of ``overrides`` per process: the
    model's option put in its place (``with_model``), then that key added."""
    from omegaconf import OmegaConf, open_dict

    cfg = with_model(composed(overrides), model)
    with open_dict(cfg):
        OmegaConf.update(cfg, f"per_dataset.data_dependent.{model}.{dataset}", False, force_add=True)
    return cfg


@functools.cache
def composed_models() -> dict:
    """Every model preset in the default composition, once per test process (each worker's
    collection parametrises over them: composing each was 3 s of every worker's collection)."""
    from bench_cli.config.compose import compose, group_options

    default = compose([])
    return {name: with_model(default, name).model for name in group_options("model")}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a temp cwd with an empty data root, so nothing touches the user's files."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("ATTNBENCH_OUTPUT", str(tmp_path / "outputs"))
    return tmp_path


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch) -> Path:
    """A folder first on sys.path, as PYTHONPATH puts a user's plugins, for plugin modules imported
    in the test's process as a fresh process imports them: no plugin loaded yet, no user config
    folder, ATTNBENCH_PLUGINS unset. Afterwards the registries, the plugins, the environment and
    sys.modules are as before (the modules imported from the folder are forgotten)."""
    import attnbench.tasks as tasks
    from attnbench.models.attention import registry
    from bench_cli.config import checks, plugins, search_path

    folder = tmp_path / "plugins"
    folder.mkdir(exist_ok=True)
    tasks.discover()  # the families stay registered after the test only if discovered first
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_DONE", False)
    monkeypatch.setattr(search_path, "_CONFIG_DIRS", [])
    monkeypatch.setattr(search_path, "_SEARCHPATH_DIRS", [])
    monkeypatch.delenv(plugins.PLUGINS_ENV, raising=False)
    monkeypatch.syspath_prepend(str(folder))
    plugins._packages.cache_clear()
    loaded = dict(sys.modules)  # the folder is new: what is imported from it is imported after this
    with registry.ATTENTIONS.restoring(), tasks.TASKS.restoring():
        yield folder
    # the modules imported during the test only (a name taken again included), their file names
    # compared as text: a Path and is_relative_to for each of the ~6,000 modules loaded was 60 ms a test
    inside = str(folder) + os.sep
    for name, module in [(name, module) for name, module in sys.modules.items() if loaded.get(name) is not module]:
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.startswith(inside):
            del sys.modules[name]
    plugins._packages.cache_clear()
    checks._group_defaults.cache_clear()


def write_ts(path: Path, series: list[np.ndarray], labels: list, classes: list[str] | None, missing: bool) -> None:
    """Write multivariate series (length_i, channels) in the `.ts` format; NaN -> '?'. With
    ``classes`` a classification file (``@classLabel true ...``), without one a regression file
    (``@targetLabel true``, float targets), as the UEA and TSER archives write them."""
    dims = series[0].shape[1]
    equal = len({len(s) for s in series}) == 1
    label_line = f"@classLabel true {' '.join(classes)}" if classes is not None else "@targetLabel true"
    lines = [
        "# attnbench test fixture",
        f"@problemName {path.stem.split('_')[0]}",
        "@timeStamps false",
        f"@missing {str(missing).lower()}",
        "@univariate false",
        f"@dimensions {dims}",
        f"@equalLength {str(equal).lower()}",
        label_line,
        "@data",
    ]
    for s, y in zip(series, labels):
        chans = [",".join("?" if np.isnan(v) else f"{v:.6f}" for v in s[:, j]) for j in range(dims)]
        lines.append(":".join(chans) + f":{y}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def uea_fixture(workdir):
    """A two-class, 3-channel UEA dataset 'Fixture' under the data root: unequal lengths (5-9),
    missing values, classes separable by the sign of channel 0."""
    rng = np.random.RandomState(0)
    root = workdir / "data" / "uea" / "Fixture"

    def make(n):
        series, labels = [], []
        for i in range(n):
            cls = i % 2
            s = rng.randn(rng.randint(5, 10), 3) * 0.3
            s[:, 0] += 2.0 if cls else -2.0
            if i % 3 == 0:
                s[rng.randint(len(s)), rng.randint(3)] = np.nan
            series.append(s)
            labels.append("up" if cls else "down")
        return series, labels

    for split, n in (("TRAIN", 40), ("TEST", 20)):
        s, y = make(n)
        write_ts(root / f"Fixture_{split}.ts", s, y, ["down", "up"], missing=True)
    return root


@pytest.fixture
def tser_fixture(workdir):
    """A 2-channel regression dataset 'RegFixture' under the data root in the TSER `.ts` format:
    unequal lengths (6-11), missing values ('?'), target = 3 x mean of channel 0 + noise."""
    rng = np.random.RandomState(1)
    root = workdir / "data" / "tser" / "RegFixture"

    def make(n):
        series, targets = [], []
        for i in range(n):
            s = rng.randn(rng.randint(6, 12), 2)
            targets.append(round(float(3.0 * s[:, 0].mean() + 0.1 * rng.randn()), 6))
            if i % 4 == 0:
                s[rng.randint(1, len(s) - 1), 1] = np.nan
            series.append(s)
        return series, targets

    for split, n in (("TRAIN", 48), ("TEST", 16)):
        s, y = make(n)
        write_ts(root / f"RegFixture_{split}.ts", s, y, None, missing=True)
    return root


@pytest.fixture
def single_thread():
    """One intra-op thread: tiny shapes run fastest that way, above all on a busy 2-core machine."""
    import torch  # here, not at the top: xdist's controller loads this file before it starts the
    # workers, and has no use for torch (2 s of the suite's start)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def float64_single_thread(single_thread):
    """Equation tests compare in float64, on one thread."""
    import torch

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)
