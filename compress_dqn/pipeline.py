"""Runs the stages of one recipe in order and owns the run directory and resume.

    run_dir/
      recipe.yaml            the resolved recipe (a rerun with a different recipe is refused)
      stages.json            finished stages and what they produced (a finished stage is not redone)
      baseline/weights.npz   the trained Q-network (npz, no pickle)
      baseline/replay.npz    the final replay buffer (calibration/distillation data for compression)
      baseline/checkpoints/  resumable training state while training runs
      baseline/saved_model/  slim SavedModel, serving_default: observations -> q_values, action
      baseline/policy.tflite fp32 TFLite with the same signature
      tensorboard/baseline/  TensorBoard scalars
      results.json           schema_version 1

Every file is written under a temporary name and renamed, so an interrupted run never leaves
a half-written artifact behind, and rerunning the same command picks up where it stopped.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from compress_dqn.errors import UserError
from compress_dqn.recipe import Recipe, recipe_from_data

SCHEMA_VERSION = 1


@dataclass
class RunOutcome:
    """Where the run lives and what it produced."""

    run_dir: Path
    results: dict[str, Any]
    resumed: bool


def _atomic_text(path: Path, text: str) -> None:
    from compress_dqn.train import atomic_write_text

    atomic_write_text(path, text)


def _first_difference(old: Any, new: Any, prefix: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
            if found:
                return found
        return None
    return None if old == new else f"{prefix}: {old!r} -> {new!r}"


def prepare_run_dir(recipe: Recipe, run_dir: Path) -> bool:
    """Create the run directory, or check an existing one holds this same recipe. Returns resumed."""
    recipe_file = run_dir / "recipe.yaml"
    new = recipe.to_dict()
    if recipe_file.exists():
        try:
            old = recipe_from_data(yaml.safe_load(recipe_file.read_text()), str(recipe_file)).to_dict()
        except (UserError, yaml.YAMLError):
            raise UserError(f"{run_dir}: its recipe.yaml is unreadable; pass another --out or delete the directory") from None
        diff = _first_difference(old, new)
        if diff:
            raise UserError(
                f"{run_dir}: holds a run of a different recipe ({diff}); pass another --out or delete the directory"
            )
        return True
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir}: exists and is not a compress-dqn run directory; pass another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic_text(recipe_file, yaml.safe_dump(new, sort_keys=False))
    return False


class Stages:
    """stages.json: each finished stage's outputs; written atomically after every stage."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "stages.json"
        self.done: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def finish(self, name: str, outputs: dict[str, Any]) -> None:
        self.done[name] = outputs
        _atomic_text(self.path, json.dumps(self.done, indent=2))


def run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Train, export and evaluate the baseline of one recipe in run_dir (resuming if it is there)."""
    from compress_dqn.envs import env_info, make_env
    from compress_dqn.evaluate import evaluate
    from compress_dqn.measure import measure_size
    from compress_dqn.policy import TFLitePolicy

    run_dir = Path(run_dir)
    # Check the environment before creating anything: a bad id leaves no run directory behind.
    probe = make_env(recipe.env.id, recipe.env.kwargs, recipe.env.max_episode_steps)
    info = env_info(probe, recipe.env.id)
    probe.close()
    resumed = prepare_run_dir(recipe, run_dir)
    stages = Stages(run_dir)
    base = run_dir / "baseline"

    from compress_dqn._tf import tf_keras  # noqa: F401  (TensorFlow from here on)
    from compress_dqn.export import export_saved_model, export_tflite, write_bytes_atomic
    from compress_dqn.networks import build_q_network, count_params
    from compress_dqn.train import DQNTrainer, _load_arrays, _save_arrays

    # 1. Train (resumes from baseline/checkpoints when interrupted).
    if "train" not in stages.done:
        trainer = DQNTrainer(
            recipe.train, recipe.env, recipe.replay, seed=recipe.seed,
            ckpt_dir=base / "checkpoints", tb_dir=run_dir / "tensorboard" / "baseline",
            label="baseline", quiet=quiet,
        )
        result = trainer.train()
        for name, arrays in (("weights.npz", result.model.get_weights()), ("replay.npz", result.replay.state_dict())):
            tmp = base / f".tmp-{name}"
            _save_arrays(tmp, arrays)
            tmp.replace(base / name)
        stages.finish("train", {
            "env_steps": result.env_steps,
            "gradient_steps": result.gradient_steps,
            "episodes": result.episodes,
            "wall_seconds": round(result.wall_seconds, 3),
            "env_steps_per_second": round(result.env_steps_per_second, 1),
            "resumed_from_step": result.resumed_from,
            "selected_step": result.selected_step,
            "selected_eval_return": result.selected_return,
            "replay_capacity": result.replay.capacity,
            "replay_nbytes": result.replay.nbytes,
        })
        shutil.rmtree(base / "checkpoints", ignore_errors=True)
        log(f"[baseline] trained {result.env_steps} steps in {result.wall_seconds:.1f} s "
            f"({result.env_steps_per_second:.0f} steps/s)")
    model = build_q_network(info.obs_shape, info.n_actions, recipe.train.net_arch, recipe.train.activation)
    model.set_weights(_load_arrays(base / "weights.npz"))

    # 2. Export a slim SavedModel and an fp32 TFLite file.
    if "export" not in stages.done:
        export_saved_model(model, info.obs_shape, info.obs_dtype, base / "saved_model")
        export_tflite(base / "saved_model", base / "policy.tflite")
        params, nonzero = count_params(model)
        size = measure_size(params, nonzero, base / "policy.tflite", base / "saved_model")
        stages.finish("export", {"artifacts": {"saved_model": "baseline/saved_model", "tflite": "baseline/policy.tflite"},
                                 "size": size.to_dict()})
        log(f"[baseline] exported: TFLite {size.tflite_bytes} bytes ({size.tflite_gzip_bytes} gzipped)")

    # 3. Evaluate the deployed artifact (TFLite) on the fixed episode seeds.
    if "evaluate" not in stages.done:
        policy = TFLitePolicy(base / "policy.tflite")
        stats = evaluate(policy.act, recipe.env, recipe.eval.episodes, recipe.eval.seed)
        stages.finish("evaluate", {"return": stats.to_dict()})
        log(f"[baseline] return {stats.mean:.1f} ± {stats.std:.1f} over {recipe.eval.episodes} episodes "
            f"(95% CI {stats.ci95[0]:.1f}..{stats.ci95[1]:.1f})")

    results = {
        "schema_version": SCHEMA_VERSION,
        "env_id": recipe.env.id,
        "eval": {"episodes": recipe.eval.episodes, "seed": recipe.eval.seed},
        "train": stages.done["train"],
        "variants": [{
            "name": "baseline",
            "artifacts": stages.done["export"]["artifacts"],
            "return": stages.done["evaluate"]["return"],
            "size": stages.done["export"]["size"],
            "latency_us": {"cpu": None, "gpu": None},
            "memory_bytes": {"cpu_rss": None, "gpu_peak": None},
        }],
    }
    _atomic_text(run_dir / "results.json", json.dumps(results, indent=2))
    return RunOutcome(run_dir=run_dir, results=results, resumed=resumed)
