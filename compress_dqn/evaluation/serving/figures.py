"""Typed figures of serving a policy file on a device by batch: what `bench --device` writes and results.json's GPU block holds.

Why a record of its own: these figures come from another machine than the run's (a lent GPU machine
without TensorFlow), so each file names the machine, the runtimes and their thread counts, and the
crossover it reports holds for that machine only. A figure that was not measured is None with the
reason beside it, never a guess.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from compress_dqn.evaluation.figures import Record

BENCH_VERSION = 1


class TimedCalls(Record):
    """The median latency of one call at a batch size, over `calls` timed calls (the result waited for)."""

    p50_us: float
    calls: int


class CpuRun(Record):
    """The same batch on a CPU runtime of the same machine."""

    runtime: str
    threads: int
    p50_us: float
    calls: int


class BatchFigures(Record):
    """One batch size: the device's latency with and without a CUDA graph, the CPU runtimes', the policy's
    own device memory at that batch, and how many of the batch's actions differ from the CPU's."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"graph"})
    batch: int
    eager: TimedCalls
    graph: TimedCalls | None = None
    """Replaying a captured CUDA graph of one call; None where the device has none (ServingBench.graph_note)."""
    cpu: list[CpuRun]
    peak_bytes: int | None = None
    """The device memory the policy itself held at its peak in one call (weights, input, activations),
    from the runtime's allocator; None where it keeps no count (ServingBench.memory_note)."""
    actions_differing: int
    """Of `batch` states: the device's action against the CPU runtime's (one thread) on the same state."""

    @property
    def device_us(self) -> float:
        """The device's best way to serve a call: graph replay where there is one."""
        return min(self.eager.p50_us, self.graph.p50_us) if self.graph else self.eager.p50_us

    @property
    def best_cpu(self) -> CpuRun:
        return min(self.cpu, key=lambda run: run.p50_us)


class Machine(Record):
    """Where the figures were measured."""

    device: str
    """The accelerator's name (torch's or NVML's), or "cpu" for the CPU-device path."""
    cuda: str | None = None
    driver: str | None = None
    cpu: str
    cpu_count: int


class ServingBench(Record):
    """`compress-dqn bench POLICY.onnx --device gpu|cpu`: one policy file served by batch on one machine."""

    bench_version: int = BENCH_VERSION
    policy: str
    """The policy's name in its run (the .onnx's stem as `export --target onnx` names it, or --name)."""
    file: str
    sha256: str
    form: str
    """How the file computes: fp32, int8 (exact integer ops), QDQ int8, or hybrid int8 (dynamic range)."""
    device: str
    """"cuda" (a GPU) or "cpu" (the same code on the CPU device, which tests run)."""
    runtime: str
    runtime_note: str
    tf32: bool = False
    machine: Machine
    states: str
    weights_bytes: int | None = None
    context_bytes: int | None = None
    """The runtime's own device memory before any policy (the CUDA context), from NVML."""
    context_note: str | None = None
    memory_note: str | None = None
    graph_note: str | None = None
    batches: list[BatchFigures] = Field(min_length=1)
    crossover_batch: int | None = None
    """The smallest batch from which the device beats every CPU runtime at every larger batch measured;
    None where a CPU runtime wins at the largest."""

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


def crossover(batches: list[BatchFigures]) -> int | None:
    """The batch from which the device wins at every batch measured above it (batches in increasing order)."""
    found = None
    for figures in reversed(batches):
        if figures.device_us >= figures.best_cpu.p50_us:
            break
        found = figures.batch
    return found
