"""What a generated C policy costs: flash and RAM on Cortex-M0+ and Cortex-M4F, and time per action on this CPU.

Flash and RAM are measured, not estimated: the policy is cross-compiled at -Os with `zig cc` (the
`ziglang` package, an optional extra) and linked into a minimal image whose `_start` calls
NAME_act on a global observation, so the compiler's helper routines count (on Cortex-M0+ the
64-bit multiplies and any float arithmetic are library calls). flash = text + rodata + data of that
image; RAM = data + bss (the observation buffer included) + stack, stack being the sum of every
compiled function's frame (-fstack-usage): an upper bound on the deepest call, compiler-rt's
helpers (a few words each) not counted. KB = 1,024 bytes.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import numpy as np
from pydantic import JsonValue

from compress_dqn.deploy.c.source import CPolicy, default_name, generate_c
from compress_dqn.deploy.base import ExportOptions, ExportReport
from compress_dqn.deploy.micro_figures import M0PLUS, M4F, CFigures
from compress_dqn.errors import UserError
from compress_dqn.fileio import write_text_atomic

CORTEX_M_FLAGS = {  # zig cc flags per Cortex-M part (not the export registry's targets)
    M0PLUS: ["-target", "thumb-freestanding-eabi", "-mcpu=cortex_m0plus"],
    M4F: ["-target", "thumb-freestanding-eabihf", "-mcpu=cortex_m4+vfp4d16sp"],
}
COUNTS = ("flash = text + rodata + data, RAM = data + bss + stack, of a minimal image (its _start calls NAME_act on "
          "a global observation) cross-compiled at -Os with zig cc and linked with --gc-sections; stack = the sum "
          "of all compiled frames (-fstack-usage), an upper bound; KB = 1,024 B")
_FLAGS = ["-std=c99", "-Os", "-ffunction-sections", "-fdata-sections", "-fno-unwind-tables",
          "-fno-asynchronous-unwind-tables", "-ffp-contract=off"]


INSTALL_HINT = "needs the ziglang and pyelftools packages: pip install 'compress-dqn[c]'"


def zig_available() -> bool:
    return importlib.util.find_spec("ziglang") is not None


def available() -> bool:
    """Whether flash and RAM can be measured here: zig cc (ziglang) and pyelftools, the `c` extra."""
    return zig_available() and importlib.util.find_spec("elftools") is not None


def _zig_command() -> list[str]:
    """The ziglang package's zig binary itself where it has one; else `python -m ziglang`, a Python start more per call."""
    spec = importlib.util.find_spec("ziglang")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder) / ("zig.exe" if os.name == "nt" else "zig")
        if binary.is_file():
            return [str(binary)]
    return [sys.executable, "-m", "ziglang"]


def _main_c(p: CPolicy) -> str:
    return (f'#include "{p.name}.h"\n{p.obs_type} {p.name}_observation[{p.name.upper()}_OBS_SIZE];\n'
            f"volatile int {p.name}_action;\nvoid _start(void) {{\n  {p.name}_action = {p.name}_act({p.name}_observation);\n"
            "  for (;;) {}\n}\n")


def _write(p: CPolicy, folder: Path) -> None:
    (folder / f"{p.name}.c").write_text(p.source)
    (folder / f"{p.name}.h").write_text(p.header)
    (folder / "main.c").write_text(_main_c(p))


def _zig(args: list[str], cwd: Path) -> None:
    done = subprocess.run([*_zig_command(), "cc", *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"zig cc {' '.join(args[:4])}...: {done.stderr.strip()[:400]}")


class TargetImage(TypedDict):
    """One target's minimal image: its allocated bytes by section kind, stack, and the flash and RAM they sum to."""

    text: int
    rodata: int
    data: int
    bss: int
    stack: int
    flash_bytes: int
    ram_bytes: int
    flash_kb: float
    ram_kb: float


class McuImages(TypedDict, total=False):
    """measure_mcu's answer: each target's image where measured, else the reason."""

    measured: bool
    reason: str
    targets: dict[str, TargetImage]
    counts: str


class ActionTimes(TypedDict, total=False):
    """time_per_action's answer: ns per action of the C (and of its dense form) and of LiteRT's invoke()."""

    c_ns: float
    dense_c_ns: float
    litert_invoke_ns: float
    c_compiler: str
    counts: str


def measure_target(p: CPolicy, target: str, folder: Path) -> TargetImage:
    """Build the minimal image for one target in folder; its section sizes, stack and flash/RAM totals."""
    _write(p, folder)
    flags = [*CORTEX_M_FLAGS[target], *_FLAGS]
    stack = 0
    for source in (f"{p.name}.c", "main.c"):
        su = folder / f"{source}.{target}.su"
        _zig([*flags, "-Xclang", "-stack-usage-file", "-Xclang", str(su), "-c", source, "-o", f"{source}.{target}.o"], folder)
        stack += sum(int(line.split("\t")[1]) for line in su.read_text().splitlines() if line.strip())
    elf = folder / f"{p.name}.{target}.elf"
    _zig([*flags, "-Wl,--gc-sections", "-o", elf.name, f"{p.name}.c.{target}.o", f"main.c.{target}.o"], folder)
    sections = section_sizes(elf)
    flash = sections["text"] + sections["rodata"] + sections["data"]
    ram = sections["data"] + sections["bss"] + stack
    return {**sections, "stack": stack, "flash_bytes": flash, "ram_bytes": ram,
            "flash_kb": round(flash / 1024, 2), "ram_kb": round(ram / 1024, 3)}


def section_sizes(elf: Path) -> dict[str, int]:
    """Allocated bytes of an ELF image by kind: text (code), rodata (read-only data), data, bss."""
    from elftools.elf.constants import SH_FLAGS
    from elftools.elf.elffile import ELFFile

    sizes = {"text": 0, "rodata": 0, "data": 0, "bss": 0}
    with open(elf, "rb") as f:
        for section in ELFFile(f).iter_sections():
            flags = section["sh_flags"]
            if not flags & SH_FLAGS.SHF_ALLOC:
                continue
            if section["sh_type"] == "SHT_NOBITS":
                sizes["bss"] += section["sh_size"]
            elif flags & SH_FLAGS.SHF_EXECINSTR:
                sizes["text"] += section["sh_size"]
            elif flags & SH_FLAGS.SHF_WRITE:
                sizes["data"] += section["sh_size"]
            else:
                sizes["rodata"] += section["sh_size"]
    return sizes


def measure_mcu(p: CPolicy) -> McuImages:
    """Flash and RAM on each target; {"measured": False, "reason"} where zig or pyelftools is missing.

    The targets build at once, each in a folder of its own: every zig cc call is a process of its
    own, so the two targets' builds overlap on a machine with more than one core (the measure stage
    waits on them for every policy of a run)."""
    if not available():
        return {"measured": False, "reason": INSTALL_HINT}
    with tempfile.TemporaryDirectory(prefix="compress-dqn-mcu-") as tmp:
        folders = {target: Path(tmp) / target for target in CORTEX_M_FLAGS}
        for folder in folders.values():
            folder.mkdir()
        try:
            with ThreadPoolExecutor(len(CORTEX_M_FLAGS)) as pool:  # threads: each waits on its zig processes
                futures = {target: pool.submit(measure_target, p, target, folder) for target, folder in folders.items()}
                targets = {target: future.result() for target, future in futures.items()}
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
            return {"measured": False, "reason": str(exc)[:400]}
    return {"measured": True, "targets": targets, "counts": COUNTS}


_TIMER_C = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <time.h>
#include "%(name)s.h"
/* Nanoseconds per call of %(name)s_act over n calls cycling through k observations (the best of 7 runs). */
double %(name)s_time(const %(obs)s *observations, int k, int n) {
  double best = 1e30;
  volatile int sink = 0;
  for (int r = 0; r < 7; ++r) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) sink += %(name)s_act(observations + (i %% k) * %(upper)s_OBS_SIZE);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
    if (ns < best) best = ns;
  }
  return best + 0 * sink;
}
"""


def compile_shared(p: CPolicy, folder: Path, timer: bool = False, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The policy compiled with the system's C compiler (-O2) as a shared library, loaded (defines: -D flags)."""
    (folder / f"{p.name}.c").write_text(p.source)
    (folder / f"{p.name}.h").write_text(p.header)
    sources = [f"{p.name}.c"]
    if timer:
        (folder / "timer.c").write_text(_TIMER_C % {"name": p.name, "obs": p.obs_type, "upper": p.name.upper()})
        sources.append("timer.c")
    lib = folder / f"lib{p.name}{'_timed' if timer else ''}{''.join('_' + d for d in defines)}.so"
    done = subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-shared",
                           "-fPIC", *[f"-D{d}" for d in defines], "-o", lib.name, *sources], cwd=folder, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"cc {p.name}.c: {done.stderr.strip()[:800]}")
    return ctypes.CDLL(str(lib))


def c_actor(lib: ctypes.CDLL, p: CPolicy) -> Any:
    """act(observation) -> int through the compiled NAME_act."""
    fn = getattr(lib, f"{p.name}_act")
    fn.restype = ctypes.c_int
    dtype = np.uint8 if p.obs_type == "uint8_t" else np.float32

    def act(observation: Any) -> int:
        x = np.ascontiguousarray(observation, dtype=dtype)
        return int(fn(x.ctypes.data_as(ctypes.c_void_p)))

    return act


def time_per_action(p: CPolicy, observations: np.ndarray, litert_path: Path, calls: int = 20000,
                    dense: CPolicy | None = None) -> ActionTimes:
    """ns per action of the C policy (timed in C, -O2) and of LiteRT's bare invoke() on the same observations;
    dense_c_ns, that of its dense form, where dense is given (a policy whose C stores weights compressed)."""
    dtype = np.uint8 if p.obs_type == "uint8_t" else np.float32
    obs = np.ascontiguousarray(observations, dtype=dtype)
    timed = {"c_ns": round(_c_ns(p, obs, calls), 1)}
    if dense is not None:
        timed["dense_c_ns"] = round(_c_ns(dense, obs, calls), 1)
    return {**timed, "litert_invoke_ns": round(litert_invoke_ns(litert_path, obs[0]), 1),
            "c_compiler": "cc -O2", "counts": "C: NAME_act timed in C (best of 7 runs of many calls); LiteRT: "
            "Interpreter.invoke() alone (XNNPACK, one thread) timed from Python, median of 7 runs"}


def _c_ns(p: CPolicy, obs: np.ndarray, calls: int) -> float:
    with tempfile.TemporaryDirectory(prefix="compress-dqn-ctime-") as tmp:
        lib = compile_shared(p, Path(tmp), timer=True)
        fn = getattr(lib, f"{p.name}_time")
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        return float(fn(obs.ctypes.data_as(ctypes.c_void_p), len(obs), calls))


def litert_invoke_ns(path: Path, observation: np.ndarray, calls: int = 20000) -> float:
    """Median ns of LiteRT's invoke() alone on one set observation (its default kernels, one thread)."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path), num_threads=1)
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]
    x = np.asarray(observation)
    if np.dtype(inp["dtype"]).kind in "iu" and inp["quantization"][0] and x.dtype.kind == "f":
        x = np.clip(np.round(x / inp["quantization"][0] + inp["quantization"][1]), -128, 127)
    interp.set_tensor(inp["index"], x.astype(inp["dtype"]).reshape(inp["shape"]))
    invoke, runs = interp.invoke, []
    for _ in range(7):
        start = time.perf_counter_ns()
        for _ in range(calls):
            invoke()
        runs.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(runs)


class CExport(ExportReport):
    """What `export --target c` wrote and measured: NAME.c and NAME.h, their Cortex-M cost, time per action; for
    a policy whose weights it stores compressed (form sparse, packed), the dense form's Cortex-M cost beside it."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"time_per_action", "dense_mcu"})
    policy: str
    c: str
    h: str
    name: str
    function: str
    integer_only: bool
    constants_bytes: int
    form: str
    mcu: dict[str, JsonValue]
    """measure_mcu's McuImages, as printed."""
    dense_mcu: dict[str, JsonValue] | None = None
    time_per_action: dict[str, JsonValue] | None = None
    """time_per_action's ActionTimes."""


def export(policy: Path, out: Path | None = None, options: ExportOptions = ExportOptions(), timing: bool = True) -> CExport:
    """`export --target c`: write OUT/NAME.c and OUT/NAME.h (default c/NAME; NAME: options.name or the policy's)
    for a .tflite policy; returns what they cost (flash, RAM, time per action)."""
    policy = Path(policy)
    p = generate_c(policy, options.name or default_name(policy))
    dense = generate_c(policy, p.name, compress=False) if p.form != "dense" else None
    out = Path(out) if out is not None else Path("c") / p.name
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{p.name}.c", p.source)
    write_text_atomic(out / f"{p.name}.h", p.header)
    timed = None
    if timing:
        rng = np.random.default_rng(0)
        shape = (64, p.obs_size)
        obs = rng.integers(0, 2, shape) if p.obs_type == "uint8_t" else rng.normal(0, 1, shape)
        try:
            timed = time_per_action(p, obs, policy, dense=dense)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            timed = {"measured": False, "reason": str(exc)[:400]}
    return CExport(policy=str(policy), c=str(out / f"{p.name}.c"), h=str(out / f"{p.name}.h"), name=p.name,
                   function=f"int {p.name}_act(const {p.obs_type} *observation)", integer_only=p.integer,
                   constants_bytes=p.constants_bytes, form=p.form, mcu=measure_mcu(p),
                   dense_mcu=measure_mcu(dense) if dense is not None else None, time_per_action=timed)


NOT_COMPILED = "not cross-compiled (measure.c_policy: none)"


def c_summary(policy: Path | str, cross_compile: bool = True) -> CFigures:
    """The C export's cost for results.json (as micro_summary is TFLM's): flash and RAM per target, or why
    there are none (a policy it cannot translate, an image that did not build, cross_compile False); never
    raises for those.

    No timing run (export has one): its many timed calls would cost more than the builds, and a run
    times the policy under TFLite beside it. cross_compile=False translates only (a fraction of a second where
    the cross-compiles of a CNN's source take seconds)."""
    try:
        p = generate_c(policy, default_name(Path(policy)))
    except UserError as exc:
        return CFigures(translated=False, reason=str(exc), counts=COUNTS)
    if not cross_compile:
        return CFigures(translated=True, integer_only=p.integer, form=p.form, reason=NOT_COMPILED, counts=COUNTS)
    mcu = measure_mcu(p)
    if not mcu["measured"]:
        return CFigures(translated=True, integer_only=p.integer, form=p.form, reason=mcu["reason"], counts=COUNTS)
    return CFigures(translated=True, integer_only=p.integer, form=p.form, counts=COUNTS,
                    flash_bytes={t: f["flash_bytes"] for t, f in mcu["targets"].items()},
                    ram_bytes={t: f["ram_bytes"] for t, f in mcu["targets"].items()})
