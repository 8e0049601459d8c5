"""Whether an ONNX export acts as LiteRT's reference kernels do, on the CPU this runs on.

    # 1. natively (TensorFlow-free, but needs compress-dqn): export each policy both ways, and record the
    #    states and LiteRT's reference-kernel (BUILTIN_REF) actions beside them
    .venv/bin/python benchmarks/onnx_exactness.py prepare OUT POLICY.tflite [POLICY.tflite ...] [--states FILE.npy]
    .venv/bin/python benchmarks/onnx_exactness.py prepare OUT runs/cartpole            # every policy of a run
    # 2. on the CPU to check: onnxruntime and numpy only, so it runs under an emulated CPU too
    .venv/bin/python benchmarks/onnx_exactness.py count OUT [--forms exact,qdq]
    qemu-x86_64 -cpu Haswell .venv/bin/python benchmarks/onnx_exactness.py count OUT  # an AVX2-only CPU
    .venv/bin/python benchmarks/onnx_exactness.py --smoke POLICY.tflite                 # 256 states, seconds

`count` prints one JSON line per policy and ONNX form (`exact`: integer ops, the default; `qdq`:
QuantizeLinear/DequantizeLinear pairs that onnxruntime fuses), with the actions that differ from the
reference's under onnxruntime's default graph optimizations and with them off, one state a call and
all in one batch; the file's bytes (and gzipped), and with default optimizations on one thread the
p50 of one call at batch 1 and the time per state in one batch of all; and a last line naming the CPU (its model name and the AVX-512/VNNI flags).
States: `--states` (an .npy of observations), else a run's held-out observations (baseline/heldout_obs.npz)
topped up to --n with uniform draws (uint8 over 0..255, float over [-2, 2)).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FORMS = ("exact", "qdq")
FEATURES = ("AVX2", "AVX512F", "AVX512VNNI", "AVXVNNI")


def _policies(paths: list[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in paths:
        files = sorted(path.glob("**/policy.tflite")) if path.is_dir() else [path]
        for f in files:
            name = f.parent.name if f.stem == "policy" else f.stem
            found[name if name not in found else f"{f.parent.parent.name}-{name}"] = f
    return found


def _states(path: Path, given: Path | None, shape: tuple[int, ...], dtype: np.dtype, n: int) -> np.ndarray:
    if given is not None:
        return np.load(given)[:n]
    held = np.zeros((0, *shape), dtype)
    run = next((p for p in [path, *path.parents] if (p / "baseline" / "heldout_obs.npz").exists()), None)
    if run is not None:
        with np.load(run / "baseline" / "heldout_obs.npz", allow_pickle=False) as f:
            obs = f[f.files[0]]
        if obs.shape[1:] == shape:
            held = obs[:n].astype(dtype)
    rng, rest = np.random.default_rng(0), (n - len(held), *shape)
    if dtype == np.uint8:
        drawn = rng.integers(0, 256, rest).astype(np.uint8)
    else:
        drawn = rng.uniform(-2, 2, rest).astype(dtype)
    return np.concatenate([held, drawn])


def prepare(out: Path, paths: list[Path], states_file: Path | None, n: int) -> None:
    """Export every policy both ways into OUT, with its states and the reference kernels' actions."""
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.onnx.export import export as export_onnx
    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    out.mkdir(parents=True, exist_ok=True)
    for name, policy in _policies(paths).items():
        reference = TFLitePolicy(policy, reference_kernels=True)
        obs = read_policy_graph(policy).observation  # the raw observation: float where the file takes int8
        states = _states(policy, states_file, reference.obs_shape, np.dtype(np.float32 if obs.quantized else obs.dtype), n)
        np.savez(out / f"{name}.npz", states=states, actions=reference.actions(states).astype(np.int64))
        for form in FORMS:
            export_onnx(policy, out / f"{name}.{form}.onnx", ExportOptions(onnx_int8=form))
        print(json.dumps({"policy": str(policy), "name": name, "states": len(states)}), flush=True)


def _cpu() -> dict:
    """The host's model name, and the instruction sets that cpuid reports to this process (numpy asks it
    as onnxruntime does: under qemu-user, the emulated CPU's, where /proc/cpuinfo shows the host's)."""
    from numpy._core._multiarray_umath import __cpu_features__

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    return {"host_cpu": model, **{name: bool(__cpu_features__.get(name, False)) for name in FEATURES}}


def _one_at_a_time(session, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    actions, seconds = [], []
    for s in states:
        start = time.perf_counter()
        actions.append(session.run(["action"], {"observations": s[None]})[0][0])
        seconds.append(time.perf_counter() - start)
    return np.array(actions), np.array(seconds)


def count(folder: Path, forms: tuple[str, ...] = FORMS) -> list[dict]:
    """For every exported file: actions differing from the reference kernels', per optimization level."""
    import onnxruntime as ort

    rows = []
    for data in sorted(folder.glob("*.npz")):
        with np.load(data, allow_pickle=False) as f:
            states, actions = f["states"], f["actions"]
        for form in forms:
            path = folder / f"{data.stem}.{form}.onnx"
            raw = path.read_bytes()
            row = {"policy": data.stem, "form": form, "states": len(states), "bytes": len(raw),
                   "gzipped_bytes": len(gzip.compress(raw, 9))}
            for level, tag in ((ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "default"),
                               (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "optimizations_off")):
                options = ort.SessionOptions()
                options.graph_optimization_level = level
                options.intra_op_num_threads = 1
                session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                one, seconds = _one_at_a_time(session, states)
                start = time.perf_counter()
                batch = session.run(["action"], {"observations": states})[0]
                if tag == "default":  # what a user's session costs: p50 of one call, and a state in one batch
                    row["p50_us_batch1"] = round(float(np.median(seconds)) * 1e6, 1)
                    row["us_per_state_in_batch"] = round((time.perf_counter() - start) / len(states) * 1e6, 2)
                row[f"differ_{tag}"] = int(np.sum(one != actions))
                row[f"differ_{tag}_batch"] = int(np.sum(batch != actions))
            rows.append(row)
            print(json.dumps(row), flush=True)
    cpu = {**_cpu(), "onnxruntime": ort.__version__}
    print(json.dumps(cpu), flush=True)
    return rows


def smoke(paths: list[Path]) -> None:
    """The given policies on 256 states each: prepared, counted; the exact form must agree on every state."""
    with tempfile.TemporaryDirectory() as tmp:
        prepare(Path(tmp) / "out", paths, None, 256)
        rows = count(Path(tmp) / "out")
        exact = [r for r in rows if r["form"] == "exact"]
        if not exact or any(r[key] for r in exact for key in r if key.startswith("differ")):
            sys.exit(f"the exact form differs from the reference kernels: {exact}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", type=Path, nargs="+", metavar="POLICY")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("prepare")
    p.add_argument("out", type=Path)
    p.add_argument("policies", type=Path, nargs="+")
    p.add_argument("--states", type=Path)
    p.add_argument("--n", type=int, default=4096)
    c = sub.add_parser("count")
    c.add_argument("folder", type=Path)
    c.add_argument("--forms", default=",".join(FORMS), help="which ONNX forms to count (default: both)")
    args = parser.parse_args()
    if args.smoke:
        smoke(args.smoke)
    elif args.command == "prepare":
        prepare(args.out, args.policies, args.states, args.n)
    elif args.command == "count":
        count(args.folder, tuple(args.forms.split(",")))
    else:
        parser.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
