"""Run independent units of work (a seed's pipeline, one variant, a search candidate) in parallel.

Two engines, same results: `local` is a process pool on this machine; `ray` sends each unit to a
Ray Core task, on a local Ray instance or, with `address`, an existing cluster. Units are plain
functions of plain (picklable) arguments that write their own files and return plain data, so the
engine only moves small dicts. Workers are fresh processes (spawned, never forked: TensorFlow is
not fork-safe), and each one gets the same TensorFlow thread count whatever the engine, so a unit's
results do not depend on where it ran.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any, TypeVar

import psutil

from compress_dqn.envs.user_env import imported_modules, ray_runtime_env
from compress_dqn.errors import UserError

T = TypeVar("T")


def cpu_count() -> int:
    """CPUs this process may use (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, psutil.cpu_count() or 1)


def worker_count(units: int, workers: int | None) -> int:
    """Units run at once: as asked, else one per CPU; never more than there are units."""
    return max(1, min(units, workers if workers is not None else cpu_count()))


def threads_per_worker(workers: int) -> int:
    """TensorFlow intra-op threads each concurrent unit gets, so units do not oversubscribe the CPUs."""
    return max(1, cpu_count() // max(1, workers))


def exit_with_parent(parent: int, poll_seconds: float = 1.0) -> None:
    """In a pool worker: exit as soon as the process that started it is gone.

    Why: a `compress-dqn run` killed with SIGKILL cannot shut its pool down, and spawned workers
    otherwise live on (each holding TensorFlow's ~700 MB) and may finish a unit into the run
    directory while the resumed run works in it.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def local_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of `workers` spawned processes that exit with this one."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                               initializer=exit_with_parent, initargs=(os.getpid(),))


def start_local_pool(workers: int, warm: Callable[[], Any]) -> ProcessPoolExecutor:
    """local_pool(workers) with every worker started now and running warm() (e.g. its imports):
    a caller starts the workers' ~5 s TensorFlow import while it does other work, and its units,
    submitted later with map_units(pool=...), find them ready. Shut it down when done."""
    pool = local_pool(workers)
    for _ in range(workers):  # each submit spawns a worker while none is idle
        pool.submit(warm)
    return pool


def map_units(
    fn: Callable[..., T],
    args: Sequence[tuple[Any, ...]],
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    on_result: Callable[[int, T], None] | None = None,
    pool: ProcessPoolExecutor | None = None,
) -> list[T]:
    """fn(*a) for each a in args, in parallel; results in the order of args.

    local with one worker runs in this process (no start-up cost, easy to debug); with more, in
    `pool` where given (start_local_pool; left running), else in a pool of its own. on_result(i, r)
    is called in this process as each unit finishes (in any order), so a caller can record it at
    once: a run killed later keeps it.
    """
    n = worker_count(len(args), workers)
    done = on_result or (lambda i, r: None)
    if executor == "local":
        if n == 1:
            results = []
            for i, a in enumerate(args):
                results.append(fn(*a))
                done(i, results[-1])
            return results
        if pool is not None:
            return _map_pool(pool, fn, args, done)
        with local_pool(n) as own:
            return _map_pool(own, fn, args, done)
    if executor == "ray":
        return _map_ray(fn, args, n, address, done)
    raise UserError(f"executor: {executor!r} is not one of local, ray")


def _map_pool(pool: ProcessPoolExecutor, fn: Callable[..., T], args: Sequence[tuple[Any, ...]],
              done: Callable[[int, T], None]) -> list[T]:
    futures = {pool.submit(fn, *a): i for i, a in enumerate(args)}
    for future in as_completed(futures):
        done(futures[future], future.result())
    return [f.result() for f in futures]


def _map_ray(fn: Callable[..., T], args: Sequence[tuple[Any, ...]], n: int, address: str | None,
             done: Callable[[int, T], None]) -> list[T]:
    try:
        import ray
    except ImportError:
        raise UserError("executor: ray needs Ray; pip install 'compress-dqn[ray]' (or set executor: local)") from None
    started_here = not ray.is_initialized()
    if started_here:
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if address is None:
            options["num_cpus"] = n  # a local instance sized like the local pool
        # The environment's own modules (package.module:Id, env.wrappers) must import in every task:
        # their folders on PYTHONPATH here, shipped to a cluster.
        runtime_env = ray_runtime_env(remote=address is not None)
        if runtime_env is not None:
            options["runtime_env"] = runtime_env
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError, TypeError) as exc:
            where = address or "a local instance"
            if runtime_env is not None and "py_modules" in runtime_env:
                raise UserError(f"address: cannot join Ray at {where} with the environment's modules "
                                f"({', '.join(imported_modules())}) shipped to it ({str(exc).splitlines()[0]}); check "
                                "the address, install the modules on the cluster's nodes, or remove address to run "
                                "Ray locally") from None
            raise UserError(f"address: cannot start or join Ray at {where} ({str(exc).splitlines()[0]}); "
                            "check the address, or remove it to start Ray locally") from None
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = [task.remote(*a) for a in args]
        index, pending = {ref: i for i, ref in enumerate(refs)}, list(refs)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            done(index[finished[0]], _ray_result(ray, finished[0]))
        return [_ray_result(ray, ref) for ref in refs]
    finally:
        if started_here:
            ray.shutdown()


def _ray_result(ray: Any, ref: Any) -> Any:
    """ray.get, with a task's UserError raised as itself (Ray's wrapper carries the remote traceback in
    its text, which would be the user's one line)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, UserError):
            raise cause from None
        raise
