"""Why small CNN students lose a MinAtar baseline's return before any quantization, and what closes it.

    .venv/bin/python benchmarks/minatar_students.py --run runs/mb --seed 0                 # ~1.5 h on 2 cores
    .venv/bin/python benchmarks/minatar_students.py --run runs/mb --seed 0 --only long-c8-32
    .venv/bin/python benchmarks/minatar_students.py --run /tmp/smoke --smoke               # tiny: a minute

`--run` is a run directory of `recipes/minatar-breakout.yaml` (or the search recipe: the same
training) whose seed's baseline is trained, or is trained first. Each study arm is a float32
student (no quantization at all, so only the distillation is measured; one arm adds the search's
QAT int8) added to that seed as a variant. Arms already built there are kept; the run builds
the others, plays each against its own baseline on the same episode seeds, and decides it at the
recipe's tolerance. One JSON line per arm: its architecture and distillation,
gzipped bytes against the baseline's, the paired difference and verdict, the episodes played
identically, the agreement on decisive states, and the selection's learning curve (return on the
selection episodes against gradient steps).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

TODAY = {"steps": 40000, "learning_rate": 1e-3, "learning_rate_schedule": "linear", "select_interval": 5000,
         "select_episodes": 100, "student_states": 5000}
"""The distillation of recipes/minatar-breakout-search.yaml's students before this study."""

LONG = {**TODAY, "steps": 200000, "select_interval": 20000, "student_states": 10000, "student_states_interval": 10000}
"""5x the steps, with 10k of the student's own states every 10k steps: the recipes' distillation since this study."""

def _qat(steps: int, learning_rate: float, **options: bool) -> dict:
    """An arm's quantize block: QAT int8 as the arms measured it, one scale for the hidden layer's kernel."""
    return {"mode": "qat", "qat_steps": steps, "qat_learning_rate": learning_rate, "per_channel_dense": False, **options}


C8_32 = {"conv": [{"filters": 8, "kernel": 3}], "net_arch": [32]}
"""The search's 8-filter, 32-unit student (16,844 weights): most arms change how it learns, not its shape."""

ARMS: dict[str, dict] = {
    # The search's 8-filter, 32-unit student as it was built: the loss to explain.
    "today-c8-32": {"student": C8_32, "fine_tune": TODAY},
    # Budget: 5x the gradient steps and the student's own states, the same network.
    "long-c8-32": {"student": C8_32, "fine_tune": LONG},
    # Capacity where the weights are not: 16 filters, but a strided conv shrinks the dense layer's input.
    "long-c16s2-64": {"student": {"conv": [{"filters": 16, "kernel": 3}, {"filters": 16, "kernel": 3, "stride": 2}],
                                  "net_arch": [64]},
                      "fine_tune": LONG},
    # Where the curve stops gaining: twice the long budget.
    "xlong-c8-32": {"student": C8_32,
                    "fine_tune": {**LONG, "steps": 400000, "select_interval": 40000}},
    # The long distillation, then quantization-aware int8 as the search builds its students: the deployable policy.
    "long-c8-32-qat": {"student": C8_32,
                       "quantize": _qat(20000, 1e-4),
                       "fine_tune": LONG},
    # int8 is then the gap: QAT's fake-quantized start plays ~0, and 20k QAT steps leave it a point short.
    # Five times the QAT steps, with the distillation's DAgger plays and snapshot selection.
    "long-c8-32-qat100k": {"student": C8_32,
                           "quantize": _qat(100000, 1e-4),
                           "fine_tune": LONG},
    # Distilled through quantization almost from its first step: 20k float steps, then 200k of QAT at 1e-3.
    "qat-early-c8-32": {"student": C8_32,
                        "quantize": _qat(200000, 1e-3),
                        "fine_tune": {**LONG, "steps": 20000}},
    # QAT at 3e-4: between 1e-4 (a point short) and 1e-3 (diverged).
    "long-c8-32-qat100k-3e-4": {"student": C8_32,
                                "quantize": _qat(100000, 3e-4),
                                "fine_tune": LONG},
    # Twice the filters (33k weights, ~20x in int8): wider action gaps for int8 to keep?
    "long-c16-32-qat100k": {"student": {"conv": [{"filters": 16, "kernel": 3}], "net_arch": [32]},
                            "quantize": _qat(100000, 1e-4),
                            "fine_tune": LONG},
    # One build is a draw: the long student built 3 times, the one with the best paired difference on
    # 200 fresh episodes (seeds 200000.., used by nothing else) kept, as the LunarLander search does.
    "long-c8-32-best3": {"student": C8_32,
                         "fine_tune": LONG,
                         "candidates": {"count": 3, "episodes": 200, "seed": 200000}},
    # The long student's action gaps are a seventh of the teacher's (median 0.02 against 0.15 on
    # replay states): the Q term's scale is the Q-values' spread across states. An advantage term
    # (A = Q - mean_a Q, its error over its variance) asks for the teacher's gaps, which int8 keeps.
    "adv1-c8-32-qat100k": {"student": C8_32,
                           "quantize": _qat(100000, 1e-4),
                           "fine_tune": {**LONG, "advantage_weight": 1.0}},
    "adv4-c8-32-qat100k": {"student": C8_32,
                           "quantize": _qat(100000, 1e-4),
                           "fine_tune": {**LONG, "advantage_weight": 4.0}},
    # The advantage term did not keep int8 gaps: the int8 advantage output still ties or flips the
    # student's actions (one int8 step of its range against gaps of that size). The heads in
    # float, the body int8 (99 weights of 16.8k in float):
    "long-c8-32-qat100k-fhead": {"student": C8_32,
                                 "quantize": _qat(100000, 1e-4, float_head=True),
                                 "fine_tune": LONG},
    "long-c8-32-qat20k-fhead": {"student": C8_32,
                                "quantize": _qat(20000, 1e-4, float_head=True),
                                "fine_tune": LONG},
}
"""Each arm is a float32 student unless it names `quantize`. The QAT arms were built before QAT gave a
CNN's first Dense layer a scale per unit, so they name per_channel_dense: False; the search's
students have it (recipes/minatar-breakout-search.yaml)."""

SMOKE_ARMS = {"smoke-c4-8": {"student": {"conv": [{"filters": 4, "kernel": 3}], "net_arch": [8]},
                             "fine_tune": {"steps": 200, "select_interval": 100, "select_episodes": 2,
                                           "student_states": 50, "student_states_interval": 100}}}
SMOKE_SETS = ["train.total_timesteps=2000", "train.learning_starts=500", "train.eval_interval=1000",
              "train.eval_episodes=2", "train.checkpoint_interval=1000", "train.buffer_size=2000",
              "eval.episodes=5", "eval.max_episodes=5",
              # the rows read no memory, C or MCU figure: no memory probe, C cross-compile or TFLM arena search
              "measure.saved_model_memory=none", "measure.c_policy=none", "measure.micro=none"]


def study_recipe(recipe: Path, seed: int, arms: dict[str, dict]) -> dict:
    """The recipe on one seed with the study's arms as its only variants (float32: no quantize key)."""
    data = yaml.safe_load(recipe.read_text())
    data.pop("search", None)
    data["seeds"] = [seed]
    data["variants"] = [{"name": name, **arm} for name, arm in arms.items()]
    return data


def arm_figures(results: dict, names: list[str]) -> list[dict]:
    """One record per arm from the seed's results.json."""
    variants = {v["name"]: v for v in results["variants"]}
    baseline = variants["baseline"]
    rows = []
    for name in names:
        v = variants.get(name)
        if v is None:
            continue
        cmp = v["return_vs_baseline"]
        fine_tune = (v.get("compression") or {}).get("fine_tune") or {}
        selection = fine_tune.get("selection") or {}
        rows.append({
            "name": name, "gzip_bytes": v["size"]["tflite_gzip_bytes"],
            "ratio": round(baseline["size"]["tflite_gzip_bytes"] / v["size"]["tflite_gzip_bytes"], 1),
            "params": v["size"]["params"], "baseline_return": baseline["return"]["mean"],
            "return": v["return"]["mean"], "difference": cmp["mean"], "ci": cmp["ci"], "verdict": cmp["verdict"],
            "margin": cmp["margin"], "episodes": cmp["episodes"], "episodes_differing": cmp.get("episodes_differing"),
            "decisive_agreement": v.get("action_agreement_decisive"),
            "selected_step": selection.get("selected_step"), "curve": selection.get("evaluations"),
            "build_seconds": (v.get("compression") or {}).get("build_seconds"),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="run directory (its seed-N/ is reused or trained)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "minatar-breakout.yaml")
    parser.add_argument("--only", nargs="*", help="arms to build (default: all)")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="extra recipe overrides")
    parser.add_argument("--smoke", action="store_true", help="a tiny baseline and a tiny student: checks the plumbing")
    args = parser.parse_args()
    arms = SMOKE_ARMS if args.smoke else {k: v for k, v in ARMS.items() if not args.only or k in args.only}
    sets = (SMOKE_SETS if args.smoke else []) + args.sets
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "students-study.yaml"
        recipe.write_text(yaml.safe_dump(study_recipe(args.recipe, args.seed, arms), sort_keys=False))
        command = ["run", str(recipe), "--out", str(args.run), "--quiet"]
        for item in sets:
            command += ["--set", item]
        from compress_dqn.cli import run_in_process

        run_in_process(command)
    results = json.loads((args.run / f"seed-{args.seed}" / "results.json").read_text())
    for row in arm_figures(results, list(arms)):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
