"""Executors: a local process pool and Ray run the same units and give the same results."""

import operator
import os
import time
from functools import partial
from pathlib import Path

import pytest

from compress_dqn.errors import UserError
from compress_dqn.run.executors import map_units, start_local_pool, threads_per_worker, worker_count
from compress_dqn.recipe.schema import load_recipe

from conftest import TINY


def test_worker_count_is_bounded_by_units_and_request():
    assert worker_count(1, None) == 1
    assert worker_count(3, 2) == 2
    assert worker_count(2, 8) == 2
    assert threads_per_worker(1) >= 1 and threads_per_worker(64) == 1


def test_local_pool_keeps_order_and_uses_other_processes():
    args = [(i, i + 1) for i in range(6)]
    assert map_units(operator.mul, args, "local", workers=2) == [i * (i + 1) for i in range(6)]
    pids = map_units(os.getpid, [()] * 4, "local", workers=2)
    assert os.getpid() not in pids
    assert map_units(os.getpid, [()], "local", workers=1) == [os.getpid()]  # one unit: inline


def _mark_warm(folder: str) -> None:
    Path(folder, str(os.getpid())).touch()


def test_a_started_pool_warms_every_worker_at_once_and_then_runs_the_units(tmp_path):
    pool = start_local_pool(2, partial(_mark_warm, str(tmp_path)))
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        warmed = {int(p.name) for p in tmp_path.iterdir()}
        assert len(warmed) == 2 and os.getpid() not in warmed  # two workers, warmed before any unit
        pids = map_units(os.getpid, [()] * 6, "local", workers=2, pool=pool)
        assert set(pids) <= warmed  # the units ran in the warmed workers, not in a pool of their own
        assert map_units(operator.mul, [(2, 3), (4, 5)], "local", workers=2, pool=pool) == [6, 20]  # left running
    finally:
        pool.shutdown()


def test_unknown_executor_and_bad_ray_address_are_clear_errors():
    with pytest.raises(UserError, match="executor: 'dask' is not one of local, ray"):
        map_units(operator.mul, [(1, 2)], "dask")
    with pytest.raises(UserError, match="address: remove it|executor: ray"):
        load_recipe(TINY, ["address=auto"])


def test_pool_workers_exit_when_the_run_is_killed(tmp_path):
    """A SIGKILLed run cannot shut its pool down: its workers must not live on (each would hold
    TensorFlow's memory and could write into the run directory the resumed run works in)."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    script = tmp_path / "pool.py"
    script.write_text(
        "import time\n"
        "from compress_dqn.run.executors import map_units\n"
        "if __name__ == '__main__':\n"
        "    map_units(time.sleep, [(60,), (60,)], 'local', 2)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.time() + 60
        while len(psutil.Process(parent.pid).children()) < 2 and time.time() < deadline:
            time.sleep(0.2)
        workers = [c for c in psutil.Process(parent.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 2
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"workers outlived the killed run: {[p.pid for p in alive]}"
