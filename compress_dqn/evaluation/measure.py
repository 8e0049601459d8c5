"""Size, latency and inference memory of policy artifacts.

Gzip is where sparsity shows: a pruned TFLite file is no smaller until compressed. Latency is
batch-1 action latency (observation in, action out) after warm-up, the number that matters for
an agent acting in a loop, plus batch-256 throughput. Inference memory is measured in a fresh
subprocess per artifact that loads only its runtime (evaluation.memory_probe for TFLite,
convert.saved_model_probe for a SavedModel: the process boundary keeps TensorFlow out of this package).
"""

from __future__ import annotations

import gc
import gzip
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn._quiet import quiet_stderr
from compress_dqn.deploy.tflite.reader import SIGNATURE
from compress_dqn.evaluation.figures import LatencyStats, MemoryProbe, SizeStats

__all__ = ["LatencyStats", "SizeStats", "measure_size", "measure_latency", "measure_memory", "compare_with_litert"]


def dir_bytes(path: Path) -> int:
    """Total bytes of the files under a directory (or one file's size)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def gzip_bytes(path: Path) -> int:
    """Size of the file gzipped at level 9: the download/flash cost of a policy."""
    return len(gzip.compress(Path(path).read_bytes(), compresslevel=9, mtime=0))


def measure_size(params: int, nonzero_params: int, tflite: Path, saved_model: Path) -> SizeStats:
    """Sizes of one variant's artifacts."""
    return SizeStats(
        params=params,
        nonzero_params=nonzero_params,
        tflite_bytes=Path(tflite).stat().st_size,
        tflite_gzip_bytes=gzip_bytes(tflite),
        saved_model_bytes=dir_bytes(saved_model),
    )


def measure_latency(policy: Any, observations: np.ndarray, calls: int = 2000, warmup: int = 1000,
                    seconds: float | None = None, min_calls: int = 500) -> LatencyStats:
    """Time `policy.act(obs)` one observation at a time, then `policy.actions` on batches of 256.

    Like timeit, the garbage collector is paused while timing so a collection does not land on one
    policy's figures and not another's; the warm-up also lets the CPU leave its idle clock.

    With a budget of `seconds`, the warm-up stops after a quarter of it and the timed calls once
    they have used it and number at least `min_calls` (the count is in the result). Why: a
    microsecond TFLite policy makes all `calls` in milliseconds, while a SavedModel call takes
    ~0.5-1 ms, and 3,000 of those per policy were ~20 s of the demo for no steadier median.
    """
    observations = np.asarray(observations)
    n = len(observations)
    act = policy.act
    perf_counter_ns = time.perf_counter_ns
    budget_ns = float("inf") if seconds is None else seconds * 1e9
    warm_until = perf_counter_ns() + budget_ns / 4
    for i in range(warmup):
        act(observations[i % n])
        if perf_counter_ns() > warm_until:
            break
    times = np.asarray(_time_calls(act, observations, calls, budget_ns, min_calls))
    batch = observations[np.arange(256) % n]
    policy.actions(batch)  # warm-up (and tensor resize for TFLite)
    repeats = 50
    start = time.perf_counter()
    for _ in range(repeats):
        policy.actions(batch)
    elapsed = time.perf_counter() - start
    policy.actions(observations[:1])  # leave a TFLite interpreter sized for acting again
    return LatencyStats(
        p50=float(np.percentile(times, 50) / 1e3),
        p99=float(np.percentile(times, 99) / 1e3),
        mean=float(times.mean() / 1e3),
        calls=len(times),
        batch256_obs_per_s=float(256 * repeats / elapsed),
    )


def compare_with_litert(policy: Any, content: bytes, observations: np.ndarray, rounds: int = 20,
                        per_round: int = 250) -> dict[str, float]:
    """p50 microseconds of `policy.act(obs)` beside LiteRT's own batch-1 work on the same file:
    `invoke()` alone, and `set_tensor` + `invoke` + `get_tensor` (the least any Python caller does).

    A plain `Interpreter` as TFLitePolicy makes one (XNNPACK, one thread) gets the observations
    ready in its input's dtype beforehand (an int8 input quantized), so the difference is our
    loader's own overhead. The three alternate in rounds, so that a busy machine's drift lands
    on each alike.
    """
    from ai_edge_litert.interpreter import Interpreter

    with quiet_stderr():
        interp = Interpreter(model_content=content, num_threads=1)
        interp.allocate_tensors()
    runner = interp.get_signature_runner(SIGNATURE)
    (inp,), action = runner.get_input_details().values(), runner.get_output_details()["action"]["index"]
    del runner
    ready = [_as_input(np.asarray(obs)[None], inp) for obs in observations]
    rows = [np.asarray(obs) for obs in observations]
    set_tensor, invoke, get_tensor, act, index = interp.set_tensor, interp.invoke, interp.get_tensor, policy.act, inp["index"]

    def set_invoke_read(x: np.ndarray) -> None:
        set_tensor(index, x)
        invoke()
        get_tensor(action)

    timed: dict[str, list[float]] = {"act": [], "set_invoke_get": [], "invoke": []}
    calls = {"act": (act, rows), "set_invoke_get": (set_invoke_read, ready), "invoke": (lambda _: invoke(), ready)}
    for warm in (True, *([False] * rounds)):
        for name, (call, inputs) in calls.items():
            times = _time_calls(call, inputs, per_round)
            if not warm:
                timed[name] += times
    p50 = {name: float(np.percentile(times, 50) / 1e3) for name, times in timed.items()}
    return {"act_p50": p50["act"], "set_invoke_get_p50": p50["set_invoke_get"], "invoke_p50": p50["invoke"],
            "act_overhead_us": p50["act"] - p50["set_invoke_get"], "calls_each": rounds * per_round}


def _as_input(x: np.ndarray, details: dict) -> np.ndarray:
    dtype = np.dtype(details["dtype"])
    scale, zero_point = details["quantization"]
    if scale and dtype.kind in "iu":
        info = np.iinfo(dtype)
        x = np.clip(np.round(x.astype(np.float32) / scale + zero_point), info.min, info.max)
    return np.ascontiguousarray(x, dtype=dtype)


def _time_calls(call: Any, inputs: Any, n: int, budget_ns: float = float("inf"), min_calls: int = 0) -> list[float]:
    """Nanoseconds of each of n calls on inputs in turn, the garbage collector paused (see
    measure_latency); with a budget, ended once the calls have spent it and number min_calls."""
    perf_counter_ns, times, count, spent = time.perf_counter_ns, [], len(inputs), 0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(n):
            x = inputs[i % count]
            start = perf_counter_ns()
            call(x)
            times.append(perf_counter_ns() - start)
            spent += times[-1]
            if spent > budget_ns and i + 1 >= min_calls:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


PROBES = {"tflite": "compress_dqn.evaluation.memory_probe", "saved_model": "compress_dqn.convert.saved_model_probe"}
"""The module each runtime's memory probe runs as (a process of its own: see measure_memory)."""


def measure_memory(artifact: Path, runtime: str, steps: int = 1000, timeout: float = 300) -> dict[str, int | str | bool]:
    """Peak RSS of a fresh process that loads one artifact with its runtime and acts `steps` times.

    runtime is "tflite" (ai_edge_litert only, no TensorFlow) or "saved_model" (TensorFlow).
    """
    if runtime not in PROBES:
        raise ValueError(f"runtime {runtime!r}: expected tflite or saved_model")
    done = subprocess.run(
        [sys.executable, "-m", PROBES[runtime], str(artifact), str(steps)],
        capture_output=True, text=True, timeout=timeout,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memory probe for {artifact} failed: {tail}")
    return MemoryProbe.model_validate_json(done.stdout.strip().splitlines()[-1]).to_dict()
