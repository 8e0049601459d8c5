"""Shared fixtures: tests shrink the recipe, not the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "recipes" / "tiny.yaml"
MINATAR = ROOT / "recipes" / "minatar-breakout.yaml"
NO_TF_MEMORY = "measure.saved_model_memory=none"
"""For runs whose test reads no TensorFlow memory figure: each SavedModel memory probe is a fresh
process importing TensorFlow (seconds of CPU). finished_tiny_run keeps the probe, and its test reads it."""
IN_PROCESS = "workers=1"
"""For runs with variants: builds them one after another in the test's process, where the default (a worker
per CPU) starts a process pool whose every worker imports TensorFlow (~6 s of CPU each) to build a few tiny
variants; a 2-core test machine gains nothing from it. The pool itself is test_executors' to prove."""
NO_MICRO_FIGURES = "measure.micro=none"
"""For runs whose test reads no TensorFlow Lite Micro arena: each policy's record keeps its flash and says why."""
NO_C_FIGURES = "measure.c_policy=none"
"""For runs whose test reads no generated-C flash / RAM figure: each policy is still translated to C (its
record says so), but not cross-compiled for two targets (seconds per policy for a CNN's C source)."""


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `compress-dqn ARGS` in a fresh interpreter, as a user would."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "compress_dqn", *args],
        cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def tiny_recipe() -> Path:
    return TINY


@pytest.fixture(scope="session")
def trained_tiny():
    """A tiny baseline trained once per test session: (recipe, TrainResult)."""
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.rl.trainer import DQNTrainer

    recipe = load_recipe(TINY, ["train.total_timesteps=600", "train.net_arch=[32, 32]"])
    result = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, quiet=True).train()
    return recipe, result


def variant(recipe, **fields):
    """A validated VariantConfig for tests."""
    from compress_dqn.recipe.schema import VariantConfig

    return VariantConfig.model_validate({"name": "v", **fields})


@pytest.fixture(scope="session")
def finished_tiny_run(tmp_path_factory) -> Path:
    """`compress-dqn run recipes/tiny.yaml --out RUN --quiet` (baseline only), run once per session
    and shared by every test that reads a finished run: a test that alters files works on a copy.

    The command runs in-process (click's runner: the CLI's own code and options) rather than in a fresh
    interpreter, which imported TensorFlow again for seconds of CPU: test_cli's kill test runs `run` to its
    end in a user's process, and its tests rerun this run's directory in one."""
    import traceback

    from click.testing import CliRunner

    from compress_dqn.cli import main

    out = tmp_path_factory.mktemp("finished") / "run"
    done = CliRunner().invoke(main, ["run", str(TINY), "--out", str(out), "--quiet",
                                     *[a for o in FINISHED_OVERRIDES for a in ("--set", o)]])
    assert done.exit_code == 0, done.output + "".join(traceback.format_exception(done.exception) if done.exception else [])
    return out


FINISHED_OVERRIDES: list[str] = []
"""The recipe overrides of finished_tiny_run (a rerun of it must pass the same): none, the tiny recipe as shipped."""


VARIANTS_RUN = ("variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 100}}, "
                "{name: qat-int8, quantize: {mode: qat, qat_steps: 30}, fine_tune: {steps: 30}}, "
                "{name: student-qat, student: {net_arch: [8]}, quantize: {mode: qat, qat_steps: 30}, fine_tune: {steps: 60}}, "
                "{name: ptq-dynamic, quantize: {mode: dynamic}}, {name: ptq-float16, quantize: {mode: float16}}]")
"""Each way a policy reaches its file: normalized post-training int8, QAT behind its normalization, a
distilled QAT student, dynamic range and float16 (float inputs); with the fp32 baseline, six files."""


@pytest.fixture(scope="session")
def tiny_variants_run(tmp_path_factory) -> Path:
    """A tiny run with VARIANTS_RUN's variants (3 eval episodes), built once per session for the tests
    that play every file a run writes (the outsider players, the C and ONNX exports)."""
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.pipeline import run

    out = tmp_path_factory.mktemp("variants") / "run"
    recipe = load_recipe(TINY, ["eval.episodes=3", "train.total_timesteps=600", NO_TF_MEMORY, VARIANTS_RUN, IN_PROCESS])
    run(recipe, out, quiet=True, log=lambda m: None)
    return out


@pytest.fixture(scope="session")
def minatar_variants_run(tmp_path_factory) -> Path:
    """The MinAtar recipe's CNN, barely trained, and its files: fp32, int8, pruned int8 (a TD fine-tune),
    QAT, dynamic range, float16; one run for the session: the CNN end-to-end test and the batched-play
    tests read the same files (a module fixture was built again by each worker that ran one of its tests)."""
    import json

    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.pipeline import run

    recipe = load_recipe(MINATAR, [
        "seeds=null", "eval.max_episodes=null", "train.total_timesteps=600", "train.learning_starts=100",
        "train.eval_interval=0", "train.checkpoint_interval=300", "train.buffer_size=2000", "eval.episodes=3",
        "variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 50}}, "
        "{name: prune-90-int8, prune: {sparsity: 0.9, exclude: [q_values]}, quantize: {mode: int8, calibration_samples: 50}, "
        "fine_tune: {method: td, steps: 200}}, "
        "{name: qat-int8, quantize: {mode: qat}, fine_tune: {steps: 64, batch_size: 16}}, "
        "{name: ptq-dynamic, quantize: {mode: dynamic}}, {name: ptq-float16, quantize: {mode: float16}}]", NO_TF_MEMORY,
        # Its tests read no C or TFLM figure: translated, not cross-compiled; no arena (test_images checks the records).
        IN_PROCESS, NO_C_FIGURES, NO_MICRO_FIGURES,
    ])
    out = tmp_path_factory.mktemp("minatar") / "run"
    outcome = run(recipe, out, quiet=True, log=lambda m: None)
    assert outcome.results.to_dict() == json.loads((out / "results.json").read_text())  # what run() returns is the file
    return out


SLOW_FIXTURES = {"trained_tiny", "finished_tiny_run", "tiny_variants_run", "minatar_variants_run"}
"""A test that needs a trained baseline or a finished run is not a unit test: it is marked slow."""

SHARED_RUNS = SLOW_FIXTURES - {"trained_tiny"}
"""The fixtures whose tests run in one worker (an xdist group each): a run costs 15-30 s to build. trained_tiny
trains in-process in seconds, so its 34 tests spread over the workers, each training it once."""


MODULE_SHARED = {"test_micro.py": "policies", "test_tflite_metadata.py": "policies", "test_measure.py": "artifacts",
                 "test_pipeline.py": "tiny_baseline"}
"""Module fixtures that convert several TensorFlow models or train a baseline (seconds each): the tests of a
module that use one run in one worker (an xdist group), which builds it once instead of every worker that
ran one of them."""


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as each test is collected, before any pytest_collection_modifyitems: a worker's xdist plugin
    # reads xdist_group marks in its own, whatever the order of the hooks.
    used = SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
    if used:
        item.add_marker(pytest.mark.slow)
        # With pytest-xdist (make test: -n auto --dist loadgroup) every worker would build its own
        # copy of a session fixture; the tests that share one run in one worker, which builds it once.
        shared = sorted(used & SHARED_RUNS)
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
            return
    fixture = MODULE_SHARED.get(item.path.name)
    if fixture in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}.{fixture}"))
