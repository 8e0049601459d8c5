"""Compress a finished run's baseline again, from a saved .keras file alone, and compare returns.

    .venv/bin/python benchmarks/byo_baseline.py --run runs/cartpole --out runs/cartpole-from-keras
    .venv/bin/python benchmarks/byo_baseline.py --run runs/tiny --out runs/tiny-from-keras --smoke

Takes RUN/recipe.yaml and RUN/baseline/weights.npz, saves the baseline Q-network as a .keras
file, and runs the same variants from that file with `baseline: {from: ...}` (data from a rollout
of the loaded policy instead of the training replay buffer), on the same evaluation seeds. Prints
one JSON line: per variant, both mean returns and whether they are within 1% of each other.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a finished single-seed run directory")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rollout-steps", type=int, default=20_000)
    parser.add_argument("--epsilon", type=float, default=0.3)
    parser.add_argument("--only", nargs="*", help="compare only these variants")
    parser.add_argument("--smoke", action="store_true",
                        help="a 500-step rollout; no TensorFlow memory, C or TFLM arena figures: checks the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.rollout_steps = 500
    run, out = Path(args.run), Path(args.out)

    from compress_dqn.envs.environment import env_info, make_env_from
    from compress_dqn.fileio import load_arrays
    from compress_dqn.rl.networks import network_for
    from compress_dqn.run.pipeline import run as run_pipeline
    from compress_dqn.recipe.schema import recipe_from_data

    data = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe = recipe_from_data(data, str(run / "recipe.yaml"))
    env = make_env_from(recipe.env)
    info = env_info(env, recipe.env.id)
    env.close()
    model = network_for(info, recipe.train)
    model.set_weights(load_arrays(run / "baseline" / "weights.npz"))
    out.mkdir(parents=True, exist_ok=True)
    keras_file = out.absolute() / "baseline.keras"
    model.save(str(keras_file))

    if args.only:
        data["variants"] = [v for v in data["variants"] if v["name"] in args.only]
    data["name"] = f"{recipe.name}-from-keras"
    data["baseline"] = {"from": str(keras_file), "rollout": {"steps": args.rollout_steps, "epsilon": args.epsilon}}
    if args.smoke:
        data["measure"] = {**data.get("measure", {}), "saved_model_memory": "none", "c_policy": "none", "micro": "none"}
    byo = recipe_from_data(data, "byo")
    results = run_pipeline(byo, out / "run", quiet=True, log=lambda m: None).results.to_dict()
    full = json.loads((run / "results.json").read_text())

    before = {v["name"]: v["return"]["mean"] for v in full["variants"]}
    after = {v["name"]: v["return"]["mean"] for v in results["variants"]}
    rows = {}
    for name, value in after.items():
        reference = before[name]
        rel = abs(value - reference) / max(abs(reference), 1e-9)
        rows[name] = {"full_pipeline": reference, "from_keras": value, "relative_difference": round(rel, 4),
                      "within_1pct": rel <= 0.01}
    print(json.dumps({"env_id": recipe.env.id, "seed": recipe.seed, "variants": rows,
                      "all_within_1pct": all(r["within_1pct"] for r in rows.values())}))


if __name__ == "__main__":
    main()
