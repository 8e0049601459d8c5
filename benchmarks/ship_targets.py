"""A run's policies on the runtime-free targets: C (flash, RAM, time, returns) and ONNX (returns), and q_values' argmax.

    .venv/bin/python benchmarks/ship_targets.py runs/cartpole                  # every variant, 30 episodes
    .venv/bin/python benchmarks/ship_targets.py runs/cartpole --variants student-32x32-qat-int8 --episodes 30
    .venv/bin/python benchmarks/ship_targets.py --smoke                        # a tiny run, built here: seconds
    .venv/bin/python benchmarks/ship_targets.py runs/tiny --variants baseline,ptq-int8 --smoke   # a finished run, 2 episodes

For each policy.tflite of the run (its baseline and variants), one JSON line:
- c: `export --target c`'s figures (Cortex-M0+/M4F flash and RAM from zig cc, time per action in C
  against LiteRT's bare invoke), then the C policy and LiteRT's reference kernels (BUILTIN_REF) each
  play the same episodes: their returns, whether they are identical episode by episode, and the steps
  of the reference's episodes where the C would act otherwise;
- onnx: the `export --target onnx` file played by tests/outsider_onnx_player.py (onnxruntime, numpy,
  gymnasium only) against evaluate's returns (compress-dqn's loader, LiteRT with XNNPACK) on the same
  seeds, and the actions that differ;
- q_values: tests/outsider_player.py playing argmax of the file's q_values output, against its action.
Episodes use the run's eval seeds (eval.seed, eval.seed + 1, ..).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from compress_dqn.deploy.litert.policy import TFLitePolicy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMOKE_VARIANTS = "variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 100}}]"


def _outsider(script: str, policy: Path, env_id: str, seed: int, episodes: int, *extra: str) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / script), str(policy), env_id, str(seed), str(episodes), *extra],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1000:])
    return json.loads(done.stdout)


def c_figures(policy: Path, env, seeds: list[int], name: str) -> dict:
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.c.measure import c_actor, compile_shared, export
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.envs.episodes import run_episodes

    with tempfile.TemporaryDirectory() as tmp:
        figures = export(policy, Path(tmp) / "out", ExportOptions(name=name))
        p = generate_c(policy, name)
        c_act, ref_act = c_actor(compile_shared(p, Path(tmp)), p), TFLitePolicy(policy, reference_kernels=True).act
        c_returns = run_episodes(c_act, env, seeds)
        differ = [0]

        def ref_checked(obs):
            theirs = ref_act(obs)
            differ[0] += c_act(obs) != theirs
            return theirs

        ref_returns = run_episodes(ref_checked, env, seeds)
    return {"flash_ram": figures.mcu, "integer_only": figures.integer_only, "constants_bytes": figures.constants_bytes,
            "time_per_action": figures.time_per_action, "returns_mean": float(np.mean(c_returns)),
            "litert_ref_returns_mean": float(np.mean(ref_returns)), "identical_episode_by_episode": c_returns == ref_returns,
            "differing_steps": differ[0]}


def onnx_disagreements(onnx_file: Path, policy: Path, env, seeds: list[int]) -> tuple[int, int]:
    """(steps where compress-dqn's loader would act otherwise, steps) on the episodes onnxruntime plays."""
    import onnxruntime as ort

    from compress_dqn.envs.episodes import run_episodes
    from compress_dqn.convert.loading import load_policy

    session, loaded, counts = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"]), load_policy(policy), [0, 0]
    inp = session.get_inputs()[0]
    dtype = np.uint8 if inp.type == "tensor(uint8)" else np.float32

    def act(obs):
        action = int(session.run(["action"], {inp.name: np.asarray(obs, dtype)[None]})[0][0])
        counts[0] += action != loaded.act(obs)
        counts[1] += 1
        return action

    run_episodes(act, env, seeds)
    return counts[0], counts[1]


def onnx_run_us(path: Path, calls: int = 2000) -> float:
    """Median microseconds of onnxruntime's InferenceSession.run on one observation (one thread, from Python)."""
    import statistics
    import time

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    shape = [1 if not isinstance(d, int) else d for d in inp.shape]
    x = np.zeros(shape, np.uint8 if inp.type == "tensor(uint8)" else np.float32)
    runs = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            session.run(["action"], {inp.name: x})
        runs.append((time.perf_counter_ns() - start) / calls / 1000)
    return round(statistics.median(runs), 2)


def variant_row(policy: Path, env, seeds: list[int], evaluate_returns: list[float]) -> dict:
    from compress_dqn.deploy.c.source import default_name
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.onnx.export import export as export_onnx

    name = default_name(policy)
    row = {"variant": policy.parent.name, "episodes": len(seeds), "evaluate_returns_mean": float(np.mean(evaluate_returns))}
    row["c"] = c_figures(policy, env, seeds, name)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = Path(tmp) / f"{name}.onnx"
        onnx_bytes = export_onnx(policy, onnx_file, ExportOptions()).bytes
        played = _outsider("outsider_onnx_player.py", onnx_file, env.id, seeds[0], len(seeds))
        run_us = onnx_run_us(onnx_file)
        differing, steps = onnx_disagreements(onnx_file, policy, env, seeds)
    row["onnx"] = {"bytes": onnx_bytes, "run_us": run_us, "returns_mean": float(np.mean(played["returns"])),
                   "identical": played["returns"] == evaluate_returns, "differing_actions": differing, "steps": steps,
                   "q_argmax_differs": played["q_argmax_differs"]}
    by_q = _outsider("outsider_player.py", policy, env.id, seeds[0], len(seeds), "q_values")
    row["q_values"] = {"argmax_returns_mean": float(np.mean(by_q["returns"])), "identical": by_q["returns"] == evaluate_returns,
                       "steps_where_argmax_differs": by_q["q_argmax_differs"]}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", type=Path, help="a finished run's folder")
    parser.add_argument("--variants", default="", help="comma-separated variant names (default: all, baseline included)")
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--smoke", action="store_true",
                        help="check RUN (or a tiny run built here when RUN is not given) on 2 episodes")
    args = parser.parse_args()
    from compress_dqn.envs.episodes import run_episodes
    from compress_dqn.convert.loading import load_policy
    from compress_dqn.recipe.schema import load_recipe

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if args.smoke:
            args.episodes = 2
        if args.smoke and run_dir is None:
            from compress_dqn.run.pipeline import run

            run_dir = Path(tmp) / "run"
            recipe = load_recipe(ROOT / "recipes" / "tiny.yaml", ["eval.episodes=2", "train.total_timesteps=400",
                                                                  "measure.saved_model_memory=none", SMOKE_VARIANTS])
            run(recipe, run_dir, quiet=True, log=lambda m: None)
        if run_dir is None:
            parser.error("give a run folder, or --smoke")
        recipe = load_recipe(run_dir / "recipe.yaml", [])
        seeds = list(range(recipe.eval.seed, recipe.eval.seed + args.episodes))
        wanted = {v for v in args.variants.split(",") if v}
        for policy in sorted(run_dir.glob("*/**/policy.tflite")):
            if wanted and policy.parent.name not in wanted:
                continue
            evaluate_returns = run_episodes(load_policy(policy).act, recipe.env, seeds)
            print(json.dumps(variant_row(policy, recipe.env, seeds, evaluate_returns)), flush=True)


if __name__ == "__main__":
    main()
