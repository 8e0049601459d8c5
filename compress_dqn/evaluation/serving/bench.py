"""`bench POLICY.onnx --device gpu|cpu`: an exported policy served by batch on a device, against the same machine's CPU.

Why: whether a GPU pays for a small policy depends on the batch (one agent, or many environments at
once) and on the machine, and a GPU machine lent to this project has no TensorFlow. So this measures
the TensorFlow-free `export --target onnx` file: on onnxruntime's CUDA provider where it is installed,
else in PyTorch through deploy/onnx/torch_runtime.py's interpreter of the exported ops. Per batch: the p50
of one call (the result waited for; CUDA-graph replay where the runtime has it, and without), the
policy's own device memory, and onnxruntime on the CPU at one thread and at every core, hence the
crossover batch; the device's actions are counted against the CPU's on the same states. TF32 is off.
`--device cpu` runs the same code on torch's CPU device, which is what the tests exercise.
"""

from __future__ import annotations

import gc
import hashlib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.evaluation.serving.figures import BatchFigures, CpuRun, Machine, ServingBench, TimedCalls, crossover
from compress_dqn.fileio import write_text_atomic

DEFAULT_BATCHES = "1,64,1024,16384"
_GET_GPU = ("on a machine with an NVIDIA GPU: pip install onnxruntime-gpu, or a CUDA build of torch (PyTorch's CUDA "
            "wheels), or run --device cpu for the same measurement on the CPU")


def parse_batches(text: str) -> list[int]:
    """'1,64,1024' -> [1, 64, 1024], or a one-line UserError."""
    try:
        batches = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        batches = []
    if not batches or batches[0] < 1:
        raise UserError(f"--batches {text!r}: give batch sizes as positive integers, e.g. --batches {DEFAULT_BATCHES}")
    return batches


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise UserError("bench --device compares with onnxruntime on the CPU: pip install 'compress-dqn[onnx]'") from None
    return onnxruntime


def _torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def choose_runtime(device: str) -> str:
    """"ort-cuda" or "torch" for `--device`, or a one-line UserError saying what is missing and how to get it."""
    ort, torch = _ort(), _torch_or_none()
    if device == "cpu":
        if torch is None:
            raise UserError("bench --device cpu plays the file in PyTorch: pip install 'compress-dqn[torch]'")
        return "torch"
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return "ort-cuda"
    ort_text = f"onnxruntime {ort.__version__} has no CUDAExecutionProvider"
    if torch is None:
        raise UserError(f"bench --device gpu: no CUDA runtime here: {ort_text} and PyTorch is not installed; {_GET_GPU}")
    if torch.version.cuda is None:
        raise UserError(f"bench --device gpu: no CUDA runtime here: torch {torch.__version__} is a CPU build and {ort_text}; "
                        f"{_GET_GPU}")
    if not torch.cuda.is_available():
        raise UserError(f"bench --device gpu: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU (check the "
                        f"driver and CUDA_VISIBLE_DEVICES); {_GET_GPU}")
    return "torch"


def _timed(call: Callable[[], Any], seconds: float, min_calls: int) -> TimedCalls:
    """p50 of `call` after a short warm-up, timed until `seconds` are spent and `min_calls` made (gc paused)."""
    for _ in range(3):
        call()
    times: list[int] = []
    budget, clock = seconds * 1e9, time.perf_counter_ns
    paused = gc.isenabled()
    gc.disable()
    try:
        while (sum(times) < budget or len(times) < min_calls) and len(times) < 200_000:
            start = clock()
            call()
            times.append(clock() - start)
    finally:
        if paused:
            gc.enable()
    return TimedCalls(p50_us=float(np.median(times)) / 1e3, calls=len(times))


class _CpuSession:
    """onnxruntime on the CPU at a thread count: the reference actions and the CPU side of the crossover."""

    def __init__(self, path: Path, threads: int) -> None:
        ort = _ort()
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input, self.threads = self.session.get_inputs()[0].name, threads
        self.runtime = f"onnxruntime {ort.__version__} CPU"

    def actions(self, states: np.ndarray) -> np.ndarray:
        return self.session.run(["action"], {self.input: states})[0]


def _machine(device_name: str, cuda: str | None, driver: str | None) -> Machine:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return Machine(device=device_name, cuda=cuda, driver=driver, cpu=cpu, cpu_count=os.cpu_count() or 1)


def _states(shape: tuple[int, ...], dtype: np.dtype, n: int) -> tuple[np.ndarray, str]:
    """n observations: raw pixels where the input is an integer image, else standard normal features."""
    rng = np.random.default_rng(0)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, 0), min(info.max, 255) + 1, (n, *shape)).astype(dtype), \
            f"uniform random {dtype} pixels (seed 0)"
    return rng.normal(size=(n, *shape)).astype(dtype), f"standard normal {dtype} features (seed 0)"


def _form(model: Any) -> str:
    ops = {node.op_type for node in model.graph.node}
    if "QuantizeLinear" in ops:
        return "QDQ int8"
    if "ReduceMin" in ops:
        return "hybrid int8 (dynamic range)"
    return "int8 (integer ops)" if ops & {"MatMulInteger", "ConvInteger"} else "fp32"


def bench_on_device(path: Path, device: str, batches: list[int], name: str | None = None, seconds: float = 0.5,
                    min_calls: int = 20) -> ServingBench:
    """Serve the .onnx file at each batch size on `device` ("gpu" or "cpu") and on this machine's CPU runtimes."""
    from compress_dqn.deploy.onnx.torch_runtime import read_onnx
    from compress_dqn.evaluation.serving.runners import open_runner

    runtime = choose_runtime(device)
    path = Path(path)
    if path.suffix != ".onnx":
        raise UserError(f"{path}: bench --device measures the .onnx that `compress-dqn export POLICY.tflite --target onnx` "
                        "writes; export it first")
    model = read_onnx(path)
    runner = open_runner(runtime, device, model, path)
    cpus = [_CpuSession(path, threads) for threads in sorted({1, os.cpu_count() or 1})]
    pool, how = _states(runner.obs_shape, runner.input_dtype, batches[-1])
    rows = []
    for batch in batches:
        states = pool[:batch]
        differing = int(np.count_nonzero(runner.actions(states) != cpus[0].actions(states)))
        graph = runner.graph(states)
        rows.append(BatchFigures(
            batch=batch, eager=_timed(runner.eager(states), seconds, min_calls),
            graph=_timed(graph, seconds, min_calls) if graph is not None else None,
            cpu=[CpuRun(runtime=c.runtime, threads=c.threads,
                        **_timed(lambda c=c: c.actions(states), seconds, min_calls).model_dump()) for c in cpus],
            peak_bytes=runner.peak_bytes(states), actions_differing=differing))
    return ServingBench(
        policy=name or path.stem, file=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(), form=_form(model),
        device=runner.device, runtime=runner.runtime, runtime_note=runner.note, machine=_machine(*runner.machine),
        states=how, weights_bytes=runner.weights_bytes, context_bytes=runner.context_bytes,
        context_note=runner.context_note, memory_note=runner.memory_note, graph_note=runner.graph_note, batches=rows,
        crossover_batch=crossover(rows))


def bench_file(path: Path, device: str, batches: str, name: str | None, out: Path | None, seconds: float) -> dict:
    """The `bench --device` command: measure, write the JSON to `out` where given, return it."""
    bench = bench_on_device(path, device, parse_batches(batches), name, seconds=seconds)
    if out is not None:
        write_text_atomic(Path(out), bench.model_dump_json(indent=2))
    return bench.to_dict()
