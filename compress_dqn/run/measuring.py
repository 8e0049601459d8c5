"""Measuring every policy of a run: batch-1 latency, inference memory per runtime, GPU and microcontroller figures
(TFLite Micro's, and the generated C policy's flash and RAM where the `c` extra is installed)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor, as_completed
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from compress_dqn.deploy import micro
from compress_dqn.deploy.c import measure as c_measure
from compress_dqn.deploy.registry import TARGETS
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.evaluation.figures import (M4F, CFigures, CpuLatency, GpuLatency, LatencyBlock, MemoryBlock,
                                             MicroFigures)
from compress_dqn.evaluation.measure import measure_latency, measure_memory
from compress_dqn.convert.saved_model import SavedModelPolicy, gpu_note, measure_gpu
from compress_dqn.recipe.schema import Recipe
from compress_dqn.run.context import RunContext, Stage
from compress_dqn.store import stage_keys as keys
from compress_dqn.store.layout import BASELINE, PolicyFiles
from compress_dqn.store.records import MeasureRecord, MemoryRecord

LATENCY_SECONDS = 0.5
"""Timed calls per runtime and policy stop after this long, once 500 are in (measure_latency)."""


PROBE_ERRORS = (RuntimeError, OSError, subprocess.SubprocessError)
"""How a memory probe process fails (measure.measure_memory): a failed, killed or timed-out probe."""


def measure_stage(name: str, ctx: RunContext) -> MeasureRecord:
    """Batch-1 latency, inference memory per runtime, GPU figures and microcontroller cost of one policy."""
    files = ctx.layout.policy(name)
    latency = CpuLatency(
        tflite=measure_latency(TFLitePolicy(files.tflite), ctx.heldout, seconds=LATENCY_SECONDS),
        saved_model=measure_latency(SavedModelPolicy(files.saved_model), ctx.heldout, seconds=LATENCY_SECONDS),
    )
    memory = ctx.stages.find(keys.memory(name), MemoryRecord) or probe_policy_memory(
        files, probes_saved_model(ctx.recipe, name))
    on_gpu = measure_gpu(files.saved_model, ctx.heldout, seconds=LATENCY_SECONDS)
    # After the timings: its compiler processes would share the CPU with them.
    in_c = c_figures(files.tflite, cross_compile=ctx.recipe.measure.c_policy == "all")
    tf_rss = memory.saved_model and f"{memory.saved_model.peak_rss / 2**20:.0f} MiB"
    c_m4f = in_c and in_c.on(M4F)
    ctx.log(f"[{name}] TFLite p50 {latency.tflite.p50:.1f} us, peak RSS {memory.tflite.peak_rss / 2**20:.0f} MiB; "
            f"SavedModel p50 {latency.saved_model.p50:.0f} us, peak RSS "
            f"{tf_rss or 'not probed (measure.saved_model_memory)'}"
            + (f"; as C ({in_c.form} weights) on a Cortex-M4F {c_m4f[0]:,} B flash, {c_m4f[1]:,} B RAM" if c_m4f else ""))
    return MeasureRecord(
        latency_us=LatencyBlock(cpu=latency, gpu=on_gpu and GpuLatency(saved_model=on_gpu.latency)),
        memory_bytes=MemoryBlock(cpu_rss=memory, gpu_peak=on_gpu and on_gpu.peak_bytes),
        micro=micro_figures(files.tflite, ctx.recipe.measure.micro == "all"), c_policy=in_c, gpu_note=gpu_note())


def probe_policy_memory(files: PolicyFiles, saved_model: bool) -> MemoryRecord:
    """Peak RSS of a fresh process acting with the policy in `files`, per runtime; the SavedModel's
    is None when `saved_model` is False (see probes_saved_model)."""
    return MemoryRecord(tflite=measure_memory(files.tflite, "tflite"),
                        saved_model=measure_memory(files.saved_model, "saved_model") if saved_model else None)


def probes_saved_model(recipe: Recipe, name: str) -> bool:
    """Whether policy `name` gets a SavedModel memory probe (a TensorFlow import of its own)."""
    mode = recipe.measure.saved_model_memory
    return mode == "all" or (mode == "baseline" and name == BASELINE)


def probe_memory(ctx: RunContext, workers: int = 1) -> None:
    """Every policy's inference memory (stages memory:NAME), `workers` probes at once.

    Each probe is a fresh process whose peak RSS does not depend on what else runs, unlike the
    timings measured after it one policy at a time; the SavedModel probe's TensorFlow import
    made it most of the measuring's wall time."""
    todo = [name for name in policy_names(ctx.recipe)
            if keys.memory(name) not in ctx.stages.done and keys.measure(name) not in ctx.stages.done]
    with ThreadPoolExecutor(max(1, workers)) as pool:  # threads: each waits on its probe process
        futures = {pool.submit(probe_policy_memory, ctx.layout.policy(name), probes_saved_model(ctx.recipe, name)): name
                   for name in todo}
        for future in as_completed(futures):
            ctx.stages.finish(keys.memory(futures[future]), future.result())


def policy_names(recipe: Recipe) -> list[str]:
    """Every policy a run measures: the baseline, then its variants."""
    return [BASELINE] + [v.name for v in recipe.variants]


def measure_stages(recipe: Recipe) -> list[Stage]:
    return [Stage(keys.measure(name), partial(measure_stage, name)) for name in policy_names(recipe)]


MICRO_NOT_MEASURED = "not measured (measure.micro: none)"


def micro_figures(tflite: Path, measure: bool = True) -> MicroFigures:
    """What the policy costs on a microcontroller (TFLite Micro: flash, measured arena, whether it
    runs), or why that was not measured (`measure` False: measure.micro: none)."""
    if not measure:
        return MicroFigures(runs=None, reason=MICRO_NOT_MEASURED, flash_bytes=tflite.stat().st_size)
    if not TARGETS["micro"].available():
        return MicroFigures(runs=None, reason=micro.INSTALL_HINT, flash_bytes=tflite.stat().st_size)
    return micro.micro_summary(tflite)


def c_figures(tflite: Path, cross_compile: bool = True) -> CFigures | None:
    """The policy's flash and RAM as generated C with no runtime (c_measure.c_summary: a policy the C export
    cannot translate gets its reason, and so does every policy where `cross_compile` is False, measure.c_policy:
    none); None where the `c` extra is not installed, which the report says once.

    No timing run (`export --target c` has one): a few cross-compiles, the targets at once, are all it costs; the
    first on a machine also builds zig's compiler-rt for each target, which zig caches for later runs."""
    return c_measure.c_summary(tflite, cross_compile) if TARGETS["c"].available() else None


C_NOT_MEASURED = f"No C flash / RAM: measuring a policy as generated C {c_measure.INSTALL_HINT}"


def c_policy_note(measured: Iterable[MeasureRecord]) -> str | None:
    """Why no policy of a run has C figures (the `c` extra was missing where it was measured); None where some have."""
    return None if any(m.c_policy is not None for m in measured) else C_NOT_MEASURED
