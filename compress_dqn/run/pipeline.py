"""Runs the stages of one recipe in order and owns the run directory and resume.

    run_dir/
      recipe.yaml            the resolved recipe (a rerun with a different recipe is refused)
      stages.json            finished stages and what they produced (a finished stage is not redone)
      baseline/weights.npz   the trained Q-network (npz, no pickle)
      baseline/heldout_obs.npz states from the baseline's evaluation episodes (for action agreement)
      baseline/replay.npz    the final replay buffer (calibration/distillation data for compression)
      baseline/checkpoints/  resumable training state while training runs
      baseline/saved_model/  slim SavedModel, serving_default: observations -> q_values, action
      baseline/policy.tflite fp32 TFLite with the same signature
      tensorboard/baseline/  TensorBoard scalars
      results.csv, report.md, report.html, *.png   the report (compress-dqn report re-renders it)
      results.json           schema_version 2 (latency_us.cpu and memory_bytes.cpu_rss per runtime;
                             gpu fields null with the reason in "gpu" where no GPU is visible)

Every file is written under a temporary name and renamed, so an interrupted run never leaves
a half-written artifact behind, and rerunning the same command picks up where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any, Callable

import yaml

from compress_dqn.run import resources
from compress_dqn.errors import UserError
from compress_dqn.fileio import (
    LOCK, load_arrays, load_dict, lock_run_dir, remove_stale_temporaries, replace_dir, save_arrays, write_bytes_atomic,
    write_text_atomic,
)
from compress_dqn.run.manifest import MANIFEST, verify, write_manifest
from compress_dqn.recipe.schema import Recipe, recipe_from_data
from compress_dqn.evaluation.report import write_report
from compress_dqn.evaluation.results import RunResults, SeedAggregate, SeedsResults, VariantResult, save_results
from compress_dqn.recipe.safe_yaml import read_yaml


@dataclass
class RunOutcome:
    """Where the run lives and what it produced."""

    run_dir: Path
    results: RunResults | SeedsResults
    resumed: bool


def _first_difference(old: Any, new: Any, prefix: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
            if found:
                return found
        return None
    return None if old == new else f"{prefix}: {old!r} -> {new!r}"


def variant_seed(seed: int, name: str) -> int:
    """A variant's TensorFlow seed: stable across processes (crc32, not Python's salted hash)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**31


_PLACEMENT_KEYS = ("executor", "address", "workers")


def prepare_run_dir(recipe: Recipe, run_dir: Path) -> bool:
    """Create the run directory, or check an existing one holds this same recipe. Returns resumed."""
    recipe_file = run_dir / "recipe.yaml"
    new = recipe.to_dict()
    if recipe_file.exists():
        lock_run_dir(run_dir)
        try:
            old = recipe_from_data(read_yaml(recipe_file), str(recipe_file)).to_dict()
        except (UserError, yaml.YAMLError):
            raise UserError(f"{run_dir}: its recipe.yaml is unreadable; pass another --out or delete the directory") from None
        # Where units run does not change what they compute: a sweep may resume on another engine.
        for key in _PLACEMENT_KEYS:
            old.pop(key, None)
        diff = _first_difference(old, {k: v for k, v in new.items() if k not in _PLACEMENT_KEYS})
        if diff and not _started(run_dir):  # a run refused before its first stage: take the corrected recipe
            write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
            return False
        if diff:
            raise UserError(
                f"{run_dir}: holds a run of a different recipe ({diff}); pass another --out or delete the directory"
            )
        remove_stale_temporaries(run_dir)  # what a killed process was writing
        if (run_dir / MANIFEST).exists():
            problems = verify(run_dir)
            if problems:
                more = f" (and {len(problems) - 1} more; see compress-dqn verify)" if len(problems) > 1 else ""
                raise UserError(f"{run_dir}: a finished run with a damaged artifact: {problems[0]}{more}; "
                                "pass another --out to rerun it")
            # From here on files get rewritten: the run is in progress again until a new manifest.
            (run_dir / MANIFEST).unlink()
        return True
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir}: exists and is not a compress-dqn run directory; pass another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_dir(run_dir)
    write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
    return False


def _started(run_dir: Path) -> bool:
    """Whether anything but the recipe (and a killed process's temporaries) was written in run_dir."""
    for path in run_dir.iterdir():
        if path.name in ("recipe.yaml", LOCK) or path.name.startswith((".tmp-", ".old-")):
            continue
        if path.name == "stages.json" and path.read_text().strip() in ("", "{}"):
            continue
        if path.is_dir() and not any(path.iterdir()):
            continue
        return True
    return False


class Stages:
    """stages.json: each finished stage's outputs; written atomically after every stage."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "stages.json"
        try:
            self.done: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (ValueError, UnicodeDecodeError):
            self.done = None  # type: ignore[assignment]
        if not isinstance(self.done, dict):
            raise UserError(f"{self.path}: unreadable (not the JSON compress-dqn writes); pass another --out, "
                            "or delete the directory to start the run again")

    def finish(self, name: str, outputs: dict[str, Any]) -> None:
        self.done[name] = outputs
        self._save()

    def _save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.done, indent=2))

    def forget_missing(self, run_dir: Path) -> list[str]:
        """Forget every finished stage whose files are gone (a variant folder deleted to rebuild it,
        a lost baseline), with the stages built on it, so that a resume redoes them instead of
        finishing a run whose results point at nothing. Returns the stages forgotten."""
        def missing(name: str, outputs: Any) -> bool:
            files = ["baseline/weights.npz", "baseline/replay.npz"] if name == "train" else []
            if isinstance(outputs, dict) and isinstance(outputs.get("artifacts"), dict):
                files += [f for f in outputs["artifacts"].values() if isinstance(f, str)]
            return any(not (run_dir / f).exists() for f in files)

        gone = [name for name, outputs in self.done.items() if missing(name, outputs)]
        if not gone:
            return []
        if any(name in ("train", "export") for name in gone):  # everything else starts from the baseline
            forget = [name for name in self.done if name != "train" or "train" in gone]
        else:
            variants = {name.split(":", 1)[1] for name in gone if name.startswith("variant:")}
            forget = [name for name in self.done if name.split(":", 1)[0] in ("variant", "memory", "measure", "look")
                      and name.rsplit(":", 1)[-1] in variants]
        for name in forget:
            self.done.pop(name, None)
        self._save()
        return forget


def _load_replay(path: Path, info: Any) -> Any:
    """The baseline's final replay buffer, fresh for each variant (so each is reproducible alone)."""
    from compress_dqn.replay.buffer import ReplayBuffer

    state = load_dict(path)
    replay = ReplayBuffer(
        len(state["obs"]), info.obs_shape, info.obs_dtype, info.n_actions, seed=0, frame_stack=info.frame_stack
    )
    replay.load_state_dict(state)
    return replay


def decisive_states(q_values: Any) -> Any:
    """Held-out states where the baseline prefers its action clearly: its gap between the best and
    second-best Q-value is at least the median gap. Where actions are near-tied (a balanced pole, a
    landed lander) any rounding flips the argmax at no cost in return, so agreement there says
    little; agreement on these states says whether the variant keeps the baseline's decisions."""
    import numpy as np

    top_two = np.sort(q_values, axis=1)[:, -2:]
    gap = top_two[:, 1] - top_two[:, 0]
    return gap >= np.median(gap)


def _evaluate(tflite: Path, recipe: Recipe, heldout: Any, baseline_actions: Any, decisive: Any) -> dict[str, Any]:
    """Return statistics on the shared episode seeds, and agreement with the baseline's actions."""
    import numpy as np

    from compress_dqn.evaluation.verdicts import evaluate
    from compress_dqn.deploy.policy import TFLitePolicy

    policy = TFLitePolicy(tflite)
    stats = evaluate(policy.act, recipe.env, recipe.eval.episodes, recipe.eval.seed)
    actions = policy.actions(heldout)
    same = actions == baseline_actions
    return {"return": stats.to_dict(), "action_agreement": float(np.mean(same)),
            "action_agreement_decisive": float(np.mean(same[decisive]))}


@dataclass
class RunContext:
    """What every stage of one seed's run reads: the recipe, the probed environment, the run
    directory and its finished stages. Heavy objects (the baseline network, held-out states) are
    loaded from the run directory on first use, so any stage can run alone in a fresh process."""

    recipe: Recipe
    run_dir: Path
    info: Any
    stages: Stages
    log: Callable[[str], None] = print
    quiet: bool = False
    device: str = "cpu"

    @property
    def base(self) -> Path:
        return self.run_dir / "baseline"

    def folder(self, name: str) -> Path:
        """Where a policy's artifacts live: baseline/ or variants/NAME/."""
        return self.base if name == "baseline" else self.run_dir / "variants" / name

    @cached_property
    def model(self) -> Any:
        """The baseline Q-network (tf_keras), with its trained weights."""
        if self.recipe.baseline is not None:
            from compress_dqn.port.baseline import load_model

            model = load_model(self.base / "model.keras", self.info)
        else:
            from compress_dqn.rl.networks import network_for

            model = network_for(self.info, self.recipe.train)
        model.set_weights(load_arrays(self.base / "weights.npz"))
        return model

    @cached_property
    def heldout(self) -> Any:
        """States from the held-out episodes (action agreement and latency are measured on them)."""
        return load_dict(self.base / "heldout_obs.npz")["observations"]

    @cached_property
    def reference(self) -> tuple[Any, Any]:
        """The baseline TFLite policy's actions on the held-out states, and which states are decisive."""
        from compress_dqn.deploy.policy import TFLitePolicy

        policy = TFLitePolicy(self.base / "policy.tflite")
        return policy.actions(self.heldout), decisive_states(policy.q_values(self.heldout))


@dataclass(frozen=True)
class Stage:
    """A named step of a run: a function of the run's context returning what stages.json keeps."""

    name: str
    run: Callable[[RunContext], dict[str, Any]]


def run_stages(ctx: RunContext, stages: list[Stage]) -> None:
    """Run each stage not finished yet, recording its outputs as soon as it ends (the resume point)."""
    for stage in stages:
        if stage.name not in ctx.stages.done:
            ctx.stages.finish(stage.name, stage.run(ctx))


def _train_stage(ctx: RunContext) -> dict[str, Any]:
    """Train the baseline (resuming from baseline/checkpoints), or load the user's network."""
    if ctx.recipe.baseline is not None:
        return _load_baseline(ctx.recipe, ctx.info, ctx.base, ctx.log)
    from compress_dqn.rl.trainer import DQNTrainer

    recipe = ctx.recipe
    trainer = DQNTrainer.from_recipe(
        recipe.train, recipe.env, recipe.replay, seed=recipe.seed,
        ckpt_dir=ctx.base / "checkpoints", tb_dir=ctx.run_dir / "tensorboard" / "baseline",
        label="baseline", quiet=ctx.quiet, device=recipe.device,
    )
    result = trainer.train()
    ctx.base.mkdir(parents=True, exist_ok=True)
    save_arrays(ctx.base / "weights.npz", result.model.get_weights())
    save_arrays(ctx.base / "replay.npz", result.replay.state_dict())
    ctx.log(f"[baseline] trained {result.env_steps} steps in {result.wall_seconds:.1f} s "
            f"({result.env_steps_per_second:.0f} steps/s)")
    return {
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
        "device": ctx.device,
        "dtype_policy": trainer.dtype_policy,
    }


def _export_stage(ctx: RunContext) -> dict[str, Any]:
    """A slim SavedModel and an fp32 TFLite file of the baseline."""
    from compress_dqn.evaluation.measure import measure_size
    from compress_dqn.deploy.export import export_policy
    from compress_dqn.rl.networks import count_params

    export_policy(ctx.model, ctx.info, ctx.base)
    params, nonzero = count_params(ctx.model)
    size = measure_size(params, nonzero, ctx.base / "policy.tflite", ctx.base / "saved_model")
    ctx.log(f"[baseline] exported: TFLite {size.tflite_bytes} bytes ({size.tflite_gzip_bytes} gzipped)")
    return {"artifacts": {"saved_model": "baseline/saved_model", "tflite": "baseline/policy.tflite"},
            "size": size.to_dict()}


def _evaluate_stage(ctx: RunContext) -> dict[str, Any]:
    """The deployed artifact (TFLite) on the fixed episode seeds."""
    from compress_dqn.evaluation.verdicts import evaluate
    from compress_dqn.deploy.policy import TFLitePolicy

    cfg = ctx.recipe.eval
    stats = evaluate(TFLitePolicy(ctx.base / "policy.tflite").act, ctx.recipe.env, cfg.episodes, cfg.seed)
    ctx.log(f"[baseline] return {stats.mean:.1f} ± {stats.std:.1f} over {cfg.episodes} episodes "
            f"(95% CI {stats.ci95[0]:.1f}..{stats.ci95[1]:.1f})")
    return {"return": stats.to_dict(), "action_agreement": 1.0}


def _random_stage(ctx: RunContext) -> dict[str, Any]:
    """A uniform-random policy on the same episode seeds: the floor of normalized scores."""
    from compress_dqn.evaluation.verdicts import random_returns, summarize

    cfg = ctx.recipe.eval
    stats = summarize(random_returns(ctx.recipe.env, range(cfg.seed, cfg.seed + cfg.episodes), ctx.info.n_actions))
    ctx.log(f"[random] return {stats.mean:.1f} ± {stats.std:.1f} (uniform-random actions, same episodes)")
    return {"return": stats.to_dict()}


def _heldout_stage(ctx: RunContext) -> dict[str, Any]:
    """States from episodes (heldout_seed..) that no calibration, fine-tune or evaluation plays."""
    save_arrays(ctx.base / "heldout_obs.npz", {"observations": heldout_states(ctx.base / "policy.tflite", ctx.recipe)})
    return {"episodes": ctx.recipe.eval.heldout_episodes, "seed": ctx.recipe.eval.heldout_seed}


BASELINE_STAGES = [Stage("train", _train_stage), Stage("export", _export_stage), Stage("evaluate", _evaluate_stage),
                   Stage("random", _random_stage), Stage("heldout", _heldout_stage)]


def _variant_stage(variant: Any, ctx: RunContext) -> dict[str, Any]:
    """Build one variant from the baseline (the best of its candidates where it has some), export
    it, evaluate it on the shared seeds."""
    from compress_dqn.evaluation.measure import measure_size

    started = time.perf_counter()
    out = ctx.folder(variant.name)
    if variant.candidates is None:
        built, exported = _build_and_export(variant, ctx, out, ctx.run_dir / "variants" / "_shared")
        picked = {}
    else:
        built, exported, picked = _pick_candidate(variant, ctx, out)
    size = measure_size(built.params, built.nonzero_params, out / "policy.tflite", out / "saved_model")
    evaluated = _evaluate(out / "policy.tflite", ctx.recipe, ctx.heldout, *ctx.reference)
    ctx.log(f"[{variant.name}] return {evaluated['return']['mean']:.1f}, TFLite {size.tflite_bytes} bytes "
            f"({size.tflite_gzip_bytes} gzipped), agreement {evaluated['action_agreement']:.3f}")
    return {
        "artifacts": {"saved_model": f"variants/{variant.name}/saved_model",
                      "tflite": f"variants/{variant.name}/policy.tflite"},
        "size": size.to_dict(),
        **evaluated,
        "compression": {**variant.model_dump(mode="json", exclude_none=True, exclude={"name"}), **picked,
                        **built.details, "tflite_sparse_format": exported["sparse_format"],
                        "build_seconds": round(time.perf_counter() - started, 1)},  # with its evaluation
    }


def _build_and_export(variant: Any, ctx: RunContext, out: Path, shared: Path | None) -> tuple[Any, dict[str, Any]]:
    """Build `variant` from the baseline and export it into `out`: (BuiltVariant, export_policy's info)."""
    from compress_dqn._tf import set_seed, tf_keras
    from compress_dqn.compress.build import build_variant
    from compress_dqn.deploy.export import export_policy

    baseline = ctx.model  # loaded (on first use) before the seed: loading draws initial weights
    # Fresh Keras name counters and a seed from the recipe and the variant's name alone: a variant
    # rebuilt after a crash, alone, or after other units in the same worker process gets the same
    # weights and the same layer (so TFLite tensor) names, hence the same bytes.
    tf_keras.backend.clear_session()
    set_seed(variant_seed(ctx.recipe.seed, variant.name))
    built = build_variant(variant, baseline, _load_replay(ctx.base / "replay.npz", ctx.info), ctx.recipe, ctx.info,
                          quiet=ctx.quiet, shared=shared)
    return built, export_policy(built.export_model, ctx.info, out, built, ctx.heldout[:500])


def candidate_name(name: str, k: int) -> str:
    """Candidate k of variant `name`: built as a variant of that name would be (seeds follow it)."""
    return f"{name}.c{k}"


def _pick_candidate(variant: Any, ctx: RunContext, out: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Build each of variant.candidates.count candidates into out/candidates/, play each and the
    baseline on the same fresh episodes, and move the best one's files into `out` (the first of
    equals). Returns its (BuiltVariant, export info) and the pick's record for results.json."""
    import numpy as np

    from compress_dqn.evaluation.verdicts import evaluate
    from compress_dqn.deploy.policy import TFLitePolicy

    cfg = variant.candidates

    def play(tflite: Path) -> Any:
        return np.asarray(evaluate(TFLitePolicy(tflite).act, ctx.recipe.env, cfg.episodes, cfg.seed).episodes)

    baseline = play(ctx.base / "policy.tflite")
    differences: list[float] = []
    best: tuple[int, Any, dict[str, Any]] | None = None
    for k in range(cfg.count):
        name = candidate_name(variant.name, k)
        # No shared pruning: candidates that loaded one pruning would all be the same build.
        built, exported = _build_and_export(variant.model_copy(update={"name": name, "candidates": None}),
                                            ctx, out / "candidates" / name, shared=None)
        differences.append(float(np.mean(play(out / "candidates" / name / "policy.tflite") - baseline)))
        ctx.log(f"[{variant.name}] candidate {k}: {differences[-1]:+.1f} against the baseline on "
                f"{cfg.episodes} fresh episodes")
        if best is None or differences[-1] > differences[best[0]]:
            best = (k, built, exported)
    k, built, exported = best
    chosen = out / "candidates" / candidate_name(variant.name, k)
    replace_dir(chosen / "saved_model", out / "saved_model")
    os.replace(chosen / "policy.tflite", out / "policy.tflite")
    shutil.rmtree(out / "candidates")
    record = {**cfg.model_dump(mode="json"), "picked": k, "fresh_differences": [round(d, 3) for d in differences]}
    return built, exported, {"candidates": record}


def variant_stages(recipe: Recipe) -> list[Stage]:
    """One stage per variant; each reads only the baseline's files, so it can run alone."""
    return [Stage(f"variant:{v.name}", partial(_variant_stage, v)) for v in recipe.variants]


LATENCY_SECONDS = 0.5
"""Timed calls per runtime and policy stop after this long, once 500 are in (measure_latency)."""


def _measure_stage(name: str, ctx: RunContext) -> dict[str, Any]:
    """Batch-1 latency, inference memory per runtime, GPU figures and microcontroller cost of one policy."""
    from compress_dqn.evaluation.measure import gpu_note, measure_gpu, measure_latency
    from compress_dqn.deploy.policy import SavedModelPolicy, TFLitePolicy

    folder = ctx.folder(name)
    latency = {
        "tflite": measure_latency(TFLitePolicy(folder / "policy.tflite"), ctx.heldout, seconds=LATENCY_SECONDS).to_dict(),
        "saved_model": measure_latency(SavedModelPolicy(folder / "saved_model"), ctx.heldout,
                                       seconds=LATENCY_SECONDS).to_dict(),
    }
    memory = ctx.stages.done.get(f"memory:{name}") or _probe_memory(folder, probes_saved_model(ctx.recipe, name))
    on_gpu = measure_gpu(folder / "saved_model", ctx.heldout, seconds=LATENCY_SECONDS)
    tf_rss = memory["saved_model"] and f"{memory['saved_model']['peak_rss'] / 2**20:.0f} MiB"
    ctx.log(f"[{name}] TFLite p50 {latency['tflite']['p50']:.1f} us, peak RSS {memory['tflite']['peak_rss'] / 2**20:.0f} MiB; "
            f"SavedModel p50 {latency['saved_model']['p50']:.0f} us, peak RSS {tf_rss or 'not probed (measure.saved_model_memory)'}")
    return {"latency_us": {"cpu": latency, "gpu": on_gpu and {"saved_model": on_gpu["latency_us"]}},
            "memory_bytes": {"cpu_rss": memory, "gpu_peak": on_gpu and on_gpu["peak_bytes"]},
            "micro": micro_figures(folder / "policy.tflite"),
            "gpu_note": gpu_note()}


def _probe_memory(folder: Path, saved_model: bool) -> dict[str, Any]:
    """Peak RSS of a fresh process acting with the policy in `folder`, per runtime; the SavedModel's
    is None when `saved_model` is False (see probes_saved_model)."""
    from compress_dqn.evaluation.measure import measure_memory

    return {"tflite": measure_memory(folder / "policy.tflite", "tflite"),
            "saved_model": measure_memory(folder / "saved_model", "saved_model") if saved_model else None}


def probes_saved_model(recipe: Recipe, name: str) -> bool:
    """Whether policy `name` gets a SavedModel memory probe (a TensorFlow import of its own)."""
    mode = recipe.measure.saved_model_memory
    return mode == "all" or (mode == "baseline" and name == "baseline")


def probe_memory(ctx: RunContext, workers: int = 1) -> None:
    """Every policy's inference memory (stages memory:NAME), `workers` probes at once.

    Each probe is a fresh process whose peak RSS does not depend on what else runs, unlike the
    timings measured after it one policy at a time; the SavedModel probe's TensorFlow import
    made it most of the measuring's wall time."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    todo = [name for name in policy_names(ctx.recipe)
            if f"memory:{name}" not in ctx.stages.done and f"measure:{name}" not in ctx.stages.done]
    with ThreadPoolExecutor(max(1, workers)) as pool:  # threads: each waits on its probe process
        futures = {pool.submit(_probe_memory, ctx.folder(name), probes_saved_model(ctx.recipe, name)): name
                   for name in todo}
        for future in as_completed(futures):
            ctx.stages.finish(f"memory:{futures[future]}", future.result())


def policy_names(recipe: Recipe) -> list[str]:
    """Every policy a run measures: the baseline, then its variants."""
    return ["baseline"] + [v.name for v in recipe.variants]


def measure_stages(recipe: Recipe) -> list[Stage]:
    return [Stage(f"measure:{name}", partial(_measure_stage, name)) for name in policy_names(recipe)]


def open_run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> tuple[RunContext, bool]:
    """Check the environment and the resources, then create or reopen run_dir. Returns (context, resumed).

    The environment is probed before anything is written: a bad id leaves no run directory behind.
    """
    from compress_dqn._tf import configure_device
    from compress_dqn.rl.envs import probe_env

    run_dir = Path(run_dir)
    info = probe_env(recipe.env)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: is a file, not a run directory; pass another --out")
    stages = Stages(run_dir)
    if "train" not in stages.done:
        resources.check(resources.plan(recipe, info), run_dir)
    device = configure_device(recipe.device)  # a device that is not there: refused before anything is written
    resumed = prepare_run_dir(recipe, run_dir)
    if resumed and (forgotten := stages.forget_missing(run_dir)):
        log(f"{run_dir}: files of {len(forgotten)} finished stage(s) are missing ({', '.join(forgotten[:3])}"
            f"{', ...' if len(forgotten) > 3 else ''}); redoing them")
    return RunContext(recipe, run_dir, info, stages, log, quiet, device), resumed


def reopen_run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunContext:
    """The context of a run directory that open_run prepared (for a unit that runs one of its stages)."""
    from compress_dqn._tf import configure_device
    from compress_dqn.rl.envs import probe_env

    run_dir = Path(run_dir)
    return RunContext(recipe, run_dir, probe_env(recipe.env), Stages(run_dir), log, quiet, configure_device(recipe.device))


def train_baseline(ctx: RunContext) -> None:
    """The baseline stages: train (or load), export, evaluate, random policy, held-out states."""
    run_stages(ctx, BASELINE_STAGES)
    shutil.rmtree(ctx.base / "checkpoints", ignore_errors=True)


def variant_unit(recipe_data: dict[str, Any], run_dir: str, variant_data: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """One variant stage in a pool worker. Returns its outputs for the run's own process to record
    (stages.json keeps one writer). Same TensorFlow threads and seeds as in that process, so the
    same bytes wherever it runs."""
    from compress_dqn._tf import configure_threads
    from compress_dqn.recipe.schema import VariantConfig

    recipe = recipe_from_data(recipe_data)
    configure_threads(recipe.train.intra_op_threads)  # before the first TensorFlow op of this process
    ctx = reopen_run(recipe, Path(run_dir), quiet=True, log=(lambda _: None) if quiet else print)
    return _variant_stage(VariantConfig(**variant_data), ctx)


PROBE_ERRORS = (RuntimeError, OSError, subprocess.SubprocessError)
"""How a memory probe process fails (measure.measure_memory): a failed, killed or timed-out probe."""


def variant_and_memory_unit(recipe_data: dict[str, Any], run_dir: str, variant_data: dict[str, Any],
                            quiet: bool, saved_model: bool) -> dict[str, Any]:
    """variant_unit, then the new policy's memory probe (stage memory:NAME) from the same worker:
    {"variant": outputs, "memory": probe}. The probe is a fresh process whose peak RSS does not
    depend on what else runs, so it can overlap other builds rather than wait for all of them."""
    outputs = variant_unit(recipe_data, run_dir, variant_data, quiet)
    try:
        memory = _probe_memory(Path(run_dir) / "variants" / variant_data["name"], saved_model)
    except PROBE_ERRORS:  # the build is kept; probe_memory tries again
        memory = None
    return {"variant": outputs, "memory": memory}


def unbuilt_variants(ctx: RunContext) -> list[Any]:
    """ctx.recipe's variants whose build stage has not finished."""
    return [v for v in ctx.recipe.variants if f"variant:{v.name}" not in ctx.stages.done]


def build_variants(ctx: RunContext, workers: int = 1, pool: Any = None) -> None:
    """Every variant stage not finished yet, `workers` at once (each variant reads only the
    baseline's files). Each is recorded as soon as it finishes, so a killed run keeps it.

    When they are built in a local pool, each worker also probes its variant's memory once built
    (a probe that fails is left to probe_memory), and the baseline's probe runs beside the
    builds: on the 2-core demo the probes (a TensorFlow import each, for the SavedModel) took
    ~40 s of wall time after the builds, part of it with one core idle. Ray units leave memory to
    probe_memory, so every policy's figure comes from the same machine. `pool`: a local pool
    started ahead (build_pool), else map_units starts one."""
    from concurrent.futures import ThreadPoolExecutor

    from compress_dqn.compress.build import build_cost
    from compress_dqn.run.executors import map_units

    todo = unbuilt_variants(ctx)
    if workers <= 1 or len(todo) <= 1:
        run_stages(ctx, variant_stages(ctx.recipe))
        return
    todo.sort(key=lambda v: -build_cost(v, ctx.recipe))  # costliest first (the pool starts them in order)
    data = ctx.recipe.to_dict()

    units = [(data, str(ctx.run_dir), v.model_dump(mode="json", exclude_none=True), ctx.quiet) for v in todo]
    if ctx.recipe.executor != "local":
        map_units(variant_unit, units, ctx.recipe.executor, workers, ctx.recipe.address,
                  on_result=lambda i, outputs: ctx.stages.finish(f"variant:{todo[i].name}", outputs))
        return

    units = [(*unit, probes_saved_model(ctx.recipe, v.name)) for unit, v in zip(units, todo)]

    def record(i: int, outputs: dict[str, Any]) -> None:
        ctx.stages.finish(f"variant:{todo[i].name}", outputs["variant"])
        if outputs["memory"] is not None and f"measure:{todo[i].name}" not in ctx.stages.done:
            ctx.stages.finish(f"memory:{todo[i].name}", outputs["memory"])

    with ThreadPoolExecutor(1) as side:  # a thread: it waits on the probe's own process
        probing = [] if {"memory:baseline", "measure:baseline"} & set(ctx.stages.done) else [
            side.submit(_probe_memory, ctx.base, probes_saved_model(ctx.recipe, "baseline"))]
        map_units(variant_and_memory_unit, units, ctx.recipe.executor, workers, ctx.recipe.address,
                  on_result=record, pool=pool)
        for future in probing:
            try:
                ctx.stages.finish("memory:baseline", future.result())
            except PROBE_ERRORS:
                pass  # probe_memory tries again after the looks


def variant_workers(ctx: RunContext) -> int:
    """Variants a single-seed run builds at once: `workers` (null: one per CPU), fewer where memory
    does not hold that many processes with the baseline's replay loaded."""
    from compress_dqn.run.executors import worker_count

    wanted = worker_count(len(ctx.recipe.variants), ctx.recipe.workers)
    return resources.fits_at_once(resources.plan(ctx.recipe, ctx.info), wanted)


def finish_run(ctx: RunContext, search: dict[str, Any] | None = None, workers: int = 1) -> RunResults:
    """Build what is left of ctx.recipe's variants (`workers` at once), decide their verdicts,
    probe every policy's memory not probed yet (`workers` at once; parallel builds probe their
    own), measure its timings (one at a time), then write results.json, the report and the
    manifest (last: its presence means finished)."""
    build_variants(ctx, workers)
    episodes = decide(ctx, workers=workers)  # more episodes where a verdict is still open
    probe_memory(ctx, workers)
    run_stages(ctx, measure_stages(ctx.recipe))
    results = collect_results(ctx, episodes)
    results.search = search
    save_results(results, ctx.run_dir / "results.json")
    write_report(ctx.run_dir)
    write_manifest(ctx.run_dir)
    return results


def run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Train, export and evaluate the baseline and every variant of one recipe in run_dir.

    Resumes: training continues from its checkpoint, finished stages are skipped.
    """
    ctx, resumed = open_run(recipe, run_dir, quiet, log)
    workers = variant_workers(ctx)
    with build_pool(ctx, workers) as pool:  # its workers start while the baseline trains
        train_baseline(ctx)
        build_variants(ctx, workers, pool)
    return RunOutcome(run_dir=ctx.run_dir, results=finish_run(ctx, workers=workers), resumed=resumed)


def warm_build_worker() -> None:
    """A build worker's imports, TensorFlow's among them (~6 s of CPU). No TensorFlow op runs,
    so variant_unit can still set the worker's thread count."""
    import compress_dqn.compress.build  # noqa: F401
    import compress_dqn.evaluation.verdicts  # noqa: F401
    import compress_dqn.deploy.export  # noqa: F401
    import compress_dqn.deploy.policy  # noqa: F401


@contextmanager
def build_pool(ctx: RunContext, workers: int) -> Iterator[Any]:
    """The local pool that will build ctx's variants, started now so that its workers import
    TensorFlow while this process trains the baseline (one TensorFlow thread on the demo: a core
    stays free); None where builds do not run in a local pool. On the 2-core demo each worker
    spent ~12 s starting after training, before its first build."""
    from compress_dqn.run.executors import start_local_pool

    todo = unbuilt_variants(ctx)
    if ctx.recipe.executor != "local" or workers <= 1 or len(todo) <= 1:
        yield None
        return
    pool = start_local_pool(min(workers, len(todo)), warm_build_worker)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def collect_results(ctx: RunContext, episodes: dict[str, list[float]]) -> RunResults:
    """results.json from the finished stages and every policy's episode returns."""
    from compress_dqn.evaluation.verdicts import paired_difference, sequential_plan, summarize

    cfg, done = ctx.recipe.eval, ctx.stages.done
    plan, confidence = sequential_plan(cfg.episodes, cfg.max_episodes)
    variants = [_variant_result("baseline", done["export"], done["evaluate"], done["measure:baseline"])] + [
        _variant_result(v.name, done[f"variant:{v.name}"], done[f"variant:{v.name}"], done[f"measure:{v.name}"])
        for v in ctx.recipe.variants
    ]
    for entry in variants:
        entry.returns = summarize(episodes[entry.name]).to_dict()
    for entry in variants[1:]:  # each variant against the baseline, episode by episode (non-inferiority)
        entry.return_vs_baseline = paired_difference(entry.returns["episodes"], variants[0].returns["episodes"],
                                                     cfg.tolerance, episodes["random"], confidence)
    return RunResults(
        env_id=ctx.recipe.env.id,
        eval={"episodes": cfg.episodes, "seed": cfg.seed, "max_episodes": plan[-1], "looks": plan,
              "confidence": confidence, "tolerance": cfg.tolerance, "heldout_seed": cfg.heldout_seed,
              "heldout_episodes": cfg.heldout_episodes},
        random={"return": summarize(episodes["random"]).to_dict()},
        train=done["train"],
        gpu=done["measure:baseline"]["gpu_note"] or "visible",
        variants=variants,
    )


def aggregate_seeds(runs: list[RunResults]) -> list[SeedAggregate]:
    """Per variant, over training seeds: IQM of the per-seed mean returns with a stratified
    bootstrap CI, and the same for the per-seed difference to that seed's baseline."""
    import numpy as np

    from compress_dqn.evaluation.verdicts import iqm, stratified_bootstrap_ci

    out = []
    # A search drops a candidate at its first losing seed: aggregate what every seed played.
    for name in [v.name for v in runs[0].variants if all(v.name in {w.name for w in run.variants} for run in runs)]:
        entries = [run.variant(name) for run in runs]
        means = np.array([v.returns["mean"] for v in entries])
        # Paired, on the episodes the variant played: the seed's baseline mean covers the most
        # episodes any variant of that seed needed, which may be many more than this one played.
        diffs = np.array([(v.return_vs_baseline or {}).get("mean", 0.0) for v in entries])
        out.append(SeedAggregate(
            name=name,
            per_seed_mean_return=means.tolist(),
            iqm_return=iqm(means),
            iqm_return_ci95=list(stratified_bootstrap_ci(means)),
            iqm_difference_vs_baseline=iqm(diffs),
            difference_ci95=list(stratified_bootstrap_ci(diffs)),
            per_seed_verdict=[v.verdict for v in entries],
            per_seed_episodes=[v.episodes for v in entries],
            tflite_gzip_bytes=int(np.median([v.size["tflite_gzip_bytes"] for v in entries])),
        ))
    return out


def _load_baseline(recipe: Recipe, info: Any, base: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The train stage for a brought baseline: load and check it, then collect its data."""
    import os

    from compress_dqn.port.baseline import file_digest, load_model, load_transitions, rollout

    source = recipe.baseline
    model = load_model(source.from_, info)
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".tmp-model-{os.getpid()}.keras"  # tf_keras wants the suffix
    model.save(str(tmp))
    os.replace(tmp, base / "model.keras")
    save_arrays(base / "weights.npz", model.get_weights())
    capacity = resources.replay_capacity(recipe.train, recipe.replay, info)
    if source.transitions is not None:
        replay, data = load_transitions(source.transitions, info, capacity, recipe.seed)
    else:
        replay, data = rollout(model, recipe.env, info, source.rollout.steps, source.rollout.epsilon, capacity, recipe.seed)
    save_arrays(base / "replay.npz", replay.state_dict())
    log(f"[baseline] loaded {source.from_}; data: {data['kind']} ({replay.num_transitions} transitions)")
    return {
        "source": {"from": str(source.from_), "sha256": file_digest(source.from_), "data": data},
        "replay_capacity": replay.capacity,
        "replay_nbytes": replay.nbytes,
    }


def run_seed_unit(recipe_data: dict[str, Any], seed_dir: str, quiet: bool) -> dict[str, Any]:
    """One seed's whole pipeline, as an executor unit: plain data in, plain data out."""
    outcome = run(recipe_from_data(recipe_data), Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    return outcome.results.to_dict()


def baseline_unit(recipe_data: dict[str, Any], seed_dir: str, quiet: bool) -> float:
    """One seed's baseline stages, as an executor unit. Returns the baseline's mean return."""
    ctx, _ = open_run(recipe_from_data(recipe_data), Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    train_baseline(ctx)
    return float(ctx.stages.done["evaluate"]["return"]["mean"])


def finish_unit(recipe_data: dict[str, Any], seed_dir: str, quiet: bool, search: dict[str, Any] | None) -> dict[str, Any]:
    """One seed's remaining stages and its results.json, as an executor unit."""
    ctx = reopen_run(recipe_from_data(recipe_data), Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    return finish_run(ctx, search).to_dict()


def seed_plan(recipe: Recipe) -> tuple[list[int], int, int]:
    """The training seeds, how many run at once, and TensorFlow threads per unit (the same on
    either engine, so per-seed results do not depend on the engine)."""
    from compress_dqn.run.executors import threads_per_worker, worker_count

    seeds = list(recipe.seeds or [recipe.seed])
    workers = worker_count(len(seeds), recipe.workers)
    return seeds, workers, recipe.train.intra_op_threads or threads_per_worker(workers)


def seed_recipes(recipe: Recipe, run_dir: Path, threads: int) -> list[tuple[int, dict[str, Any], str]]:
    """(seed, that seed's single-seed recipe as data, its directory RUN_DIR/seed-N) per seed."""
    out = []
    for seed in recipe.seeds or [recipe.seed]:
        train = recipe.train.model_copy(update={"intra_op_threads": threads})
        single = recipe.model_copy(update={"seed": seed, "seeds": None, "train": train})
        out.append((seed, single.to_dict(), str(Path(run_dir) / f"seed-{seed}")))
    return out


def run_seeds(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Run the whole pipeline once per seed in RUN_DIR/seed-N (each resumable), then aggregate.

    Seeds run in parallel on recipe.executor (local process pool or Ray); each unit gets the same
    TensorFlow thread count on either engine, so per-seed results do not depend on the engine.
    """
    from compress_dqn.rl.envs import probe_env
    from compress_dqn.run.executors import map_units

    run_dir = Path(run_dir)
    seeds, workers, threads = seed_plan(recipe)
    info = probe_env(recipe.env)
    resources.check(resources.plan(recipe, info), run_dir, at_once=workers, in_total=len(seeds))
    resumed = prepare_run_dir(recipe, run_dir)
    parallel = workers > 1 or recipe.executor == "ray"
    units = [(data, seed_dir, quiet or parallel) for _, data, seed_dir in seed_recipes(recipe, run_dir, threads)]
    where = f"{recipe.executor}, {workers} at a time, {threads} TensorFlow thread(s) each"
    log(f"[seeds] {', '.join(map(str, seeds))} on {where}")
    runs = [RunResults.from_dict(data) for data in map_units(run_seed_unit, units, recipe.executor, workers, recipe.address)]
    for seed, seed_results in zip(seeds, runs):
        baseline = seed_results.baseline.returns
        log(f"[seed {seed}] baseline {baseline['mean']:.1f} +/- {baseline['std']:.1f}")
    return RunOutcome(run_dir=run_dir, results=write_seeds_results(recipe, run_dir, runs, workers, threads),
                      resumed=resumed)


def write_seeds_results(recipe: Recipe, run_dir: Path, runs: list[RunResults], workers: int, threads: int,
                        search: dict[str, Any] | None = None) -> SeedsResults:
    """The multi-seed results.json (aggregate over the seeds' runs), its report, then the manifest."""
    seeds = list(recipe.seeds or [recipe.seed])
    results = SeedsResults(
        env_id=recipe.env.id,
        eval={"episodes": recipe.eval.episodes, "seed": recipe.eval.seed},
        seeds=seeds,
        executor={"kind": recipe.executor, "workers": workers, "intra_op_threads": threads},
        runs=[f"seed-{seed}/results.json" for seed in seeds],
        aggregate=aggregate_seeds(runs),
        search=search,
    )
    save_results(results, Path(run_dir) / "results.json")
    write_report(run_dir)
    write_manifest(run_dir)  # last: its presence means the run finished
    return results


def _variant_result(name: str, exported: dict[str, Any], evaluated: dict[str, Any],
                    measured: dict[str, Any]) -> VariantResult:
    return VariantResult(
        name=name,
        artifacts=exported["artifacts"],
        returns=evaluated["return"],
        size=exported["size"],
        action_agreement=evaluated["action_agreement"],
        action_agreement_decisive=1.0 if name == "baseline" else evaluated.get("action_agreement_decisive"),
        latency_us=measured["latency_us"],
        memory_bytes=measured["memory_bytes"],
        micro=measured.get("micro"),
        compression=exported.get("compression"),
    )


def micro_figures(tflite: Path) -> dict[str, Any]:
    """What the policy costs on a microcontroller (TFLite Micro: flash, measured arena, whether it
    runs), or why that was not measured."""
    from compress_dqn.deploy import micro

    if not micro.available():
        return {"runs": None, "reason": micro.INSTALL_HINT, "flash_bytes": tflite.stat().st_size}
    return micro.micro_summary(tflite)


def heldout_states(tflite: Path, recipe: Recipe, limit: int = 5000) -> Any:
    """States the baseline visits greedily on the held-out episode seeds (at most `limit`, evenly
    subsampled with a fixed seed): where variants' actions are compared with the baseline's."""
    import numpy as np

    from compress_dqn.evaluation.verdicts import run_episodes
    from compress_dqn.deploy.policy import TFLitePolicy

    policy = TFLitePolicy(tflite)
    visited: list[Any] = []

    def act(obs: Any) -> int:
        visited.append(np.array(obs))
        return policy.act(obs)

    cfg = recipe.eval
    run_episodes(act, recipe.env, range(cfg.heldout_seed, cfg.heldout_seed + cfg.heldout_episodes))
    pick = np.random.default_rng(cfg.heldout_seed).choice(len(visited), size=min(len(visited), limit), replace=False)
    return np.stack([visited[i] for i in sorted(pick)])


def play_unit(env_data: dict[str, Any], tflite: str | None, n_actions: int, first_seed: int, count: int) -> list[float]:
    """The returns of `count` episodes on seeds first_seed.. of the TFLite policy at `tflite`, or of a
    uniform-random policy where it is None. Plain data in and out, and no TensorFlow: a pool worker
    starts in about a second. Each episode depends only on its seed, so chunks of a range played
    apart give the returns of the range played at once."""
    from compress_dqn.evaluation.verdicts import random_returns, run_episodes
    from compress_dqn.recipe.schema import EnvConfig

    env = EnvConfig(**env_data)
    seeds = range(first_seed, first_seed + count)
    if tflite is None:
        return random_returns(env, seeds, n_actions)
    from compress_dqn.deploy.policy import TFLitePolicy

    return run_episodes(TFLitePolicy(Path(tflite)).act, env, seeds)


def _play(ctx: RunContext, wanted: dict[str, tuple[str | None, int, int]], workers: int = 1) -> dict[str, list[float]]:
    """Each wanted key's returns: (TFLite policy name or None for random, first episode, end episode),
    episode i on seed eval.seed + i. `workers` play at once, each range cut in chunks so that
    the workers finish together; the longest chunks start first."""
    from compress_dqn.run.executors import map_units, worker_count

    env_data = ctx.recipe.env.model_dump(mode="json")
    pieces = worker_count(sum(after - before for _, before, after in wanted.values()), workers)
    chunks = []  # (key, first episode, episodes, what the unit plays)
    for key, (name, before, after) in wanted.items():
        tflite = None if name is None else str(ctx.folder(name) / "policy.tflite")
        size = -(-(after - before) // pieces)
        for first in range(before, after, size):
            count = min(size, after - first)
            chunks.append((key, first, count, (env_data, tflite, ctx.info.n_actions, ctx.recipe.eval.seed + first, count)))
    chunks.sort(key=lambda chunk: -chunk[2])
    results = map_units(play_unit, [chunk[3] for chunk in chunks], ctx.recipe.executor,
                        worker_count(len(chunks), workers), ctx.recipe.address)
    played: dict[str, list[float]] = {key: [] for key in wanted}
    for (key, *_), returns in sorted(zip(chunks, results), key=lambda pair: pair[0][1]):  # in episode order
        played[key] += returns
    return played


def _play_look(ctx: RunContext, before: int, after: int, names: list[str], workers: int = 1) -> None:
    """Record episodes before..after of the reference (stage "reference:AFTER": the baseline and the
    random policy) and of each named variant (stages "look:AFTER:NAME"), played `workers` at once."""
    reference_due = f"reference:{after}" not in ctx.stages.done
    due = [name for name in names if f"look:{after}:{name}" not in ctx.stages.done]
    wanted: dict[str, tuple[str | None, int, int]] = {name: (name, before, after) for name in due}
    if reference_due:
        wanted |= {"baseline": ("baseline", before, after), "random": (None, before, after)}
    if not wanted:
        return
    played = _play(ctx, wanted, workers)
    if reference_due:
        ctx.stages.finish(f"reference:{after}", {"baseline": played["baseline"], "random": played["random"]})
    for name in due:
        ctx.stages.finish(f"look:{after}:{name}", {"episodes": played[name]})


def reference_episodes(ctx: RunContext, upto: int) -> dict[str, list[float]]:
    """The baseline's and the random policy's first `upto` episode returns (a look count), played
    once per look (stage "reference:N") and shared by every variant paired with them."""
    from compress_dqn.evaluation.verdicts import sequential_plan

    cfg, done = ctx.recipe.eval, ctx.stages.done
    episodes = {"baseline": list(done["evaluate"]["return"]["episodes"]),
                "random": list(done["random"]["return"]["episodes"])}
    plan, _ = sequential_plan(cfg.episodes, cfg.max_episodes)
    for before, after in zip(plan, plan[1:]):
        if after > upto:
            break
        _play_look(ctx, before, after, [])
        episodes["baseline"] += done[f"reference:{after}"]["baseline"]
        episodes["random"] += done[f"reference:{after}"]["random"]
    return episodes


def decide(ctx: RunContext, names: list[str] | None = None, workers: int = 1) -> dict[str, list[float]]:
    """Sequential evaluation of the named variants (default: all): at each look (episodes,
    doubling, up to eval.max_episodes) those whose verdict is still inconclusive play the next
    episodes, paired with the baseline's and the random policy's same episodes; a look's episodes
    of every open variant and of the reference are played `workers` at once. Each look is a stage
    ("look:N:NAME"), so a killed run resumes at the look it was in.

    Returns every named variant's episode returns, and the baseline's and the random policy's
    over as many episodes as the longest of them ("baseline", "random", names)."""
    from compress_dqn.evaluation.verdicts import paired_difference, sequential_plan

    cfg, done = ctx.recipe.eval, ctx.stages.done
    names = [v.name for v in ctx.recipe.variants] if names is None else names
    played = {name: list(done[f"variant:{name}"]["return"]["episodes"]) for name in names}
    plan, confidence = sequential_plan(cfg.episodes, cfg.max_episodes)
    still_open = list(names)
    for before, after in zip(plan, plan[1:]):
        reference = reference_episodes(ctx, before)
        still_open = [name for name in still_open if paired_difference(
            played[name], reference["baseline"], cfg.tolerance, reference["random"], confidence)["verdict"] == "inconclusive"]
        if not still_open:
            break
        for name in still_open:
            if f"look:{after}:{name}" not in done:
                ctx.log(f"[{name}] inconclusive after {before} episodes: playing to {after}")
        _play_look(ctx, before, after, still_open, workers)
        for name in still_open:
            played[name] += done[f"look:{after}:{name}"]["episodes"]
    longest = max([len(e) for e in played.values()], default=cfg.episodes)
    return {**reference_episodes(ctx, longest), **played}
