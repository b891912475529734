"""An interrupted `make test` stops its pytest-xdist workers and what they started
(tests/interruption.py): a suite of one test that waits on a sleeping process and ignores SIGINT,
run by an xdist controller with one worker, loading that plugin alone (no torch: the processes
start in about a second). Without the plugin, such a worker whose controller was gone ran on for
15 s (execnet's timeouts) and the process its test started until it ended."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SUITE_CONFTEST = "import interruption\n\n\ndef pytest_configure(config):\n    interruption.install(config)\n"
SLEEPING_TEST = '''import os, signal, subprocess, sys
from pathlib import Path

CHILD = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"


def test_that_does_not_yield_to_keyboard_interrupt():  # waits on a process as the suite's tests wait on `attnbench`
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Path(os.environ["PIDS"], "worker").write_text(str(os.getpid()))
    subprocess.run([sys.executable, "-c", CHILD, str(Path(os.environ["PIDS"], "child"))], timeout=120)
'''


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_controller_leaves_no_worker_nor_their_processes(workdir, signum):
    """SIGTERM is what make passes to the controller when it is killed: the run ends as interrupted.
    SIGKILL leaves the workers to notice by themselves."""
    pytest.importorskip("xdist")
    suite, pids = workdir / "suite", workdir / "pids"
    suite.mkdir()
    pids.mkdir()
    (suite / "conftest.py").write_text(SUITE_CONFTEST)
    (suite / "test_sleeping.py").write_text(SLEEPING_TEST)
    env = {**os.environ, "PIDS": str(pids), "PYTHONPATH": str(Path(__file__).parent)}
    controller = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", str(suite)],
                                  cwd=suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
    try:
        assert wait_for(lambda: sum(1 for f in pids.iterdir() if f.read_text()) == 2, 60), "the test never started"
        started = [int(f.read_text()) for f in pids.iterdir()]  # the worker, the process its test started
        assert all(alive(pid) for pid in started)
        controller.send_signal(signum)
        out, _ = controller.communicate(timeout=60)
        if signum == signal.SIGTERM:
            assert controller.returncode == 2 and "SIGTERM: the test run was asked to stop" in out, out
        # 4 s: the watcher polls every 0.5 s; execnet alone waits 15 s before it exits a worker
        assert wait_for(lambda: not any(alive(pid) for pid in started), 4), [p for p in started if alive(p)]
    finally:
        try:
            os.killpg(controller.pid, signal.SIGKILL)
        except OSError:
            pass
        controller.wait()
