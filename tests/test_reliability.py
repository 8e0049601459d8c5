"""Faults: kill -9 and resume, manifest and verify, divergence, full disks, resource refusal."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.errors import UserError
from compress_dqn.store.manifest import run_fingerprint
from compress_dqn.recipe.schema import load_recipe

from conftest import FINISHED_OVERRIDES, NO_C_FIGURES, NO_TF_MEMORY, ROOT, TINY

# Long enough to kill inside training (a checkpoint every 100 of 1000 steps), one variant; the test
# reads no TensorFlow memory or C figure (each costs its runs seconds: a fresh process, cross-compiles).
KILL_OVERRIDES = [
    "train.total_timesteps=1000", "train.checkpoint_interval=100", "eval.episodes=3",
    "variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 50}}]", NO_TF_MEMORY, NO_C_FIGURES,
]


def _args(out: Path) -> list[str]:
    """`compress-dqn ARGS`: the kill test's run of the tiny recipe into out."""
    return ["run", str(TINY), "--out", str(out), "--quiet", *_sets(KILL_OVERRIDES)]


def _command(out: Path) -> list[str]:
    return [sys.executable, "-m", "compress_dqn", *_args(out)]


def _stages(out: Path) -> dict:
    try:
        return json.loads((out / "stages.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _kill_when(out: Path, ready, timeout: float = 240) -> bool:
    """Start a run, SIGKILL it as soon as ready(out) holds; False if it finished first."""
    process = subprocess.Popen(_command(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if ready(out):
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            return True
        time.sleep(0.02)
    process.wait()
    return False


@pytest.mark.slow
def test_kill_9_at_each_stage_then_resume_equals_an_uninterrupted_run(tmp_path):
    # Only the killed runs need a user's process: the reference and the resume run in this one (click's
    # runner, the CLI's own code), sparing two TensorFlow imports. A run computes the same bytes in any
    # process (deterministic on CPU with a fixed seed), and the fingerprints below check it.
    reference = tmp_path / "reference"
    done = CliRunner().invoke(main, _args(reference))
    assert done.exit_code == 0, (done.output, done.exception)

    out = tmp_path / "killed"
    kill_points = [
        ("training", lambda d: (d / "baseline" / "checkpoints" / "latest").exists()),
        ("export", lambda d: "train" in _stages(d)),
        ("variant", lambda d: "evaluate" in _stages(d)),
        ("measure", lambda d: "variant:ptq-int8" in _stages(d)),
    ]
    killed, stages_at_kill = [], []
    for name, ready in kill_points:
        if _kill_when(out, ready):
            killed.append(name)
            stages_at_kill.append(list(_stages(out)))
    assert killed[0] == "training" and "train" not in stages_at_kill[0], \
        f"the first kill did not land inside training: stages done {stages_at_kill[0]}"
    assert len(killed) >= 3, f"the run finished before most kill points: killed at {killed}"
    assert not (out / "manifest.json").exists()  # never finished

    resumed = CliRunner().invoke(main, _args(out))
    assert resumed.exit_code == 0, (resumed.output, resumed.exception)
    assert not list(out.rglob(".tmp-*")) and not list(out.rglob(".old-*"))
    assert run_fingerprint(out) == run_fingerprint(reference)
    verified = CliRunner().invoke(main, ["verify", str(out)])
    assert verified.exit_code == 0, verified.output


@pytest.fixture
def finished_run(finished_tiny_run):
    return finished_tiny_run


def _sets(overrides: list[str]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(run_dir, target)
    return target


def test_verify_finds_truncated_modified_and_added_files(finished_run, tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["verify", str(finished_run)]).exit_code == 0
    run_dir = _copy(finished_run, tmp_path)
    tflite = run_dir / "baseline" / "policy.tflite"
    tflite.write_bytes(tflite.read_bytes()[:-16])
    weights = run_dir / "baseline" / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[-40] ^= 0xFF
    weights.write_bytes(bytes(data))
    (run_dir / "stray.txt").write_text("x")
    result = runner.invoke(main, ["verify", str(run_dir)])
    assert result.exit_code == 2
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and message.startswith("error:")
    assert "baseline/policy.tflite has" in message and "truncated" in message
    assert "baseline/weights.npz does not match its SHA-256" in message
    assert "stray.txt is not in the manifest" in message


def test_evaluate_report_and_rerun_refuse_a_corrupted_artifact(finished_run, tmp_path):
    runner = CliRunner()
    run_dir = _copy(finished_run, tmp_path)
    results = run_dir / "results.json"
    results.write_text(results.read_text().replace('"mean"', '"maen"', 1))  # same size, other bytes
    result = runner.invoke(main, ["report", str(run_dir)])
    assert result.exit_code == 2 and "results.json does not match its SHA-256" in result.output
    policy = run_dir / "baseline" / "policy.tflite"
    policy.write_bytes(policy.read_bytes()[:100])
    result = runner.invoke(main, ["evaluate", str(policy), "--env", "CartPole-v1", "--episodes", "1"])
    assert result.exit_code == 2 and "policy.tflite has 100 bytes" in result.output
    rerun = runner.invoke(main, ["run", str(TINY), "--out", str(run_dir), *_sets(FINISHED_OVERRIDES), "--quiet"])
    assert rerun.exit_code == 2 and "a finished run with a damaged artifact" in rerun.output


def test_report_rerender_keeps_the_run_verified(finished_run, tmp_path):
    runner = CliRunner()
    run_dir = _copy(finished_run, tmp_path)
    assert runner.invoke(main, ["report", str(run_dir)]).exit_code == 0
    assert runner.invoke(main, ["verify", str(run_dir)]).exit_code == 0


def test_report_does_not_sign_an_altered_policy_into_the_manifest(finished_run, tmp_path):
    """`report` rewrites manifest.json; it re-hashed every file, so one byte flipped in a policy
    became 'verified' after a routine re-render."""
    runner = CliRunner()
    run_dir = _copy(finished_run, tmp_path)
    policy = run_dir / "baseline" / "policy.tflite"
    data = bytearray(policy.read_bytes())
    data[200] ^= 0xFF
    policy.write_bytes(bytes(data))
    result = runner.invoke(main, ["report", str(run_dir)])
    assert result.exit_code == 2 and "baseline/policy.tflite does not match its SHA-256" in result.output
    assert runner.invoke(main, ["verify", str(run_dir)]).exit_code == 2
    link = tmp_path / "link"  # the same file reached through a link is checked against its run too
    link.symlink_to(run_dir / "baseline")
    result = runner.invoke(main, ["evaluate", str(link / "policy.tflite"), "--env", "CartPole-v1", "--episodes", "1"])
    assert result.exit_code == 2 and "does not match its SHA-256" in result.output


def test_only_the_baselines_checkpoints_are_left_out_of_the_manifest(tmp_path):
    from compress_dqn.store.manifest import verify, write_manifest

    for rel in ["baseline/checkpoints/step-1/weights.npz", "variants/checkpoints/policy.tflite",
                "variants/x/.tmp-export-1/saved_model.pb", "results.json"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    assert sorted(write_manifest(tmp_path).files) == ["results.json", "variants/checkpoints/policy.tflite"]
    (tmp_path / "variants" / "checkpoints" / "policy.tflite").write_bytes(b"y")
    assert verify(tmp_path) == ["variants/checkpoints/policy.tflite does not match its SHA-256 (modified or corrupted)"]


@pytest.mark.slow
def test_divergence_stops_with_a_clear_message_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    import compress_dqn.rl.trainer as train_module

    real = train_module.make_update_fn
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        update = real(*args, **kwargs)

        def run(*arrays):
            calls["n"] += 1
            loss, q = update(*arrays)
            return (loss, q) if calls["n"] < 40 else (np.float32("nan"), q)

        return run

    monkeypatch.setattr(train_module, "make_update_fn", poisoned)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(TINY), "--out", str(out), "--quiet",
                                       "--set", "train.total_timesteps=1000", "--set", "train.checkpoint_interval=100"])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "training diverged: loss nan at env step" in message
    assert "lower the learning rate" in message and "last good checkpoint is kept" in message
    latest = out / "baseline" / "checkpoints" / (out / "baseline" / "checkpoints" / "latest").read_text().strip()
    assert (latest / "state.json").is_file() and (latest / "model.npz").is_file()
    kept_step = json.loads((latest / "state.json").read_text())["step"]
    assert 0 < kept_step < 1000
    weights = np.load(latest / "model.npz")
    assert all(np.isfinite(weights[k]).all() for k in weights.files)


@pytest.mark.slow
def test_a_full_disk_mid_run_leaves_the_last_checkpoint_intact(tmp_path, monkeypatch):
    import compress_dqn.rl.trainer as train_module
    from compress_dqn.rl.trainer import DQNTrainer, latest_checkpoint

    real = train_module.save_arrays
    writes = {"n": 0}

    def filling_disk(path, arrays):
        if Path(path).name == "replay.npz" and ".tmp-step" in str(path):
            writes["n"] += 1
            if writes["n"] == 3:  # the third checkpoint's replay does not fit
                Path(path).parent.joinpath("partial").write_bytes(b"x" * 100)
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, arrays)

    monkeypatch.setattr(train_module, "save_arrays", filling_disk)
    recipe = load_recipe(TINY, ["train.total_timesteps=1000", "train.checkpoint_interval=100"])
    ckpt = tmp_path / "checkpoints"
    trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, ckpt_dir=ckpt, quiet=True)
    with pytest.raises(UserError, match=r"cannot write .*checkpoints/step-\d+: no space left on device "
                                        r"\(the last good checkpoint step-\d+ is intact\); free some space"):
        trainer.train()
    kept = latest_checkpoint(ckpt)
    assert kept is not None and (kept / "replay.npz").is_file()
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]
    # The kept checkpoint resumes.
    kept_step = json.loads((kept / "state.json").read_text())["step"]
    monkeypatch.setattr(train_module, "save_arrays", real)
    resumed = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, ckpt_dir=ckpt, quiet=True).train()
    assert resumed.resumed_from == kept_step


def test_runs_that_do_not_fit_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "run"
    result = runner.invoke(main, ["run", str(TINY), "--out", str(out), "--set", "train.buffer_size=2e9"])
    assert result.exit_code == 2 and "of memory" in result.output and "lower train.buffer_size" in result.output
    assert not out.exists()

    import compress_dqn.run.resources as resources

    usage = resources.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda p: usage._replace(free=10 << 20))
    result = runner.invoke(main, ["run", str(TINY), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "of disk under" in result.output and "10.0 MiB is free" in result.output
    assert not out.exists()


def test_saved_model_with_the_wrong_signature_or_shape_is_refused(tmp_path):
    from compress_dqn._tf import tf
    from compress_dqn.deploy.litert.policy import check_compatible
    from compress_dqn.convert.loading import load_policy

    module = tf.Module()
    module.v = tf.Variable(1.0)
    module.f = tf.function(lambda x: {"out": x * module.v}, input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "other"), signatures={"predict": module.f})
    with pytest.raises(UserError, match="serving_default"):
        load_policy(tmp_path / "other")
    with pytest.raises(UserError, match=r"shape \(4,\) but MinAtar/Breakout-v1 gives \(10, 10, 4\)"):
        from compress_dqn.convert.conversion import export_saved_model
        from compress_dqn.rl.networks import build_q_network

        export_saved_model(build_q_network((4,), 3, [8]), (4,), np.float32, tmp_path / "sm")
        check_compatible(load_policy(tmp_path / "sm"), (10, 10, 4), 3, "MinAtar/Breakout-v1", "sm")


def test_no_pickle_no_eval_no_unsafe_yaml_in_the_package():
    import re

    forbidden = re.compile(r"import pickle|allow_pickle=True|yaml\.load\(|yaml\.unsafe_load|yaml\.(Unsafe|Full)?Loader\b|"
                           r"(?<![\w.])(eval|exec)\(")
    for path in (ROOT / "compress_dqn").rglob("*.py"):
        text = path.read_text()
        if path.relative_to(ROOT / "compress_dqn").as_posix() == "port/tensor_pickle.py":
            # The one unpickler: its find_class admits tensor rebuilds only (test_port_safety runs a real payload).
            assert text.count("def find_class") == 2
            text = text.replace("import pickle\n", "", 1)
        found = forbidden.search(text)
        assert found is None, f"{path.name} uses {found.group(0)}"


def test_variant_names_cannot_leave_the_run_directory():
    for name in ("../../x", "a/b", "/abs", ".hidden", "..", ""):
        with pytest.raises(UserError, match="variants.0.name"):
            load_recipe(TINY, [f"variants=[{{name: '{name}', quantize: {{mode: dynamic}}}}]"])


def test_a_foreign_manifest_above_a_copied_policy_is_not_a_run(finished_run, tmp_path):
    """A web app's manifest.json above a copied policy made evaluate refuse it as a damaged run."""
    import shutil

    models = tmp_path / "webapp" / "public" / "models"
    models.mkdir(parents=True)
    (tmp_path / "webapp" / "manifest.json").write_text('{"name": "My PWA", "start_url": "/"}')
    shutil.copy(finished_run / "baseline" / "policy.tflite", models / "policy.tflite")
    result = CliRunner().invoke(main, ["evaluate", str(models / "policy.tflite"), "--env", "CartPole-v1", "--episodes", "1"])
    assert result.exit_code == 0, result.output


def test_resume_rebuilds_a_finished_stage_whose_files_are_gone(finished_run, tmp_path):
    """An interrupted run (no manifest yet) with a variant's folder deleted: stages.json said the
    variant was done, so the resumed run wrote results and a clean manifest pointing at nothing."""
    import shutil

    from compress_dqn.store.manifest import verify
    from compress_dqn.run.pipeline import run

    run_dir = _copy(finished_run, tmp_path)
    (run_dir / "manifest.json").unlink()
    before = (run_dir / "baseline" / "policy.tflite").read_bytes()
    shutil.rmtree(run_dir / "baseline" / "saved_model")
    (run_dir / "baseline" / "policy.tflite").unlink()
    messages: list[str] = []
    run(load_recipe(TINY, FINISHED_OVERRIDES), run_dir, quiet=True, log=messages.append)
    assert any("are missing (export" in m for m in messages), messages
    assert (run_dir / "baseline" / "policy.tflite").read_bytes() == before  # exported again, the same bytes
    assert "train" in json.loads((run_dir / "stages.json").read_text())  # the trained weights were kept
    assert verify(run_dir) == []


def test_forget_missing_drops_only_what_was_built_on_the_lost_files(tmp_path):
    from compress_dqn.evaluation.figures import Record
    from compress_dqn.store.stages import Stages

    class Outputs(Record):
        artifacts: dict[str, str] | None = None

    def artifacts(folder):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "policy.tflite").write_bytes(b"x")
        return Outputs(artifacts={"tflite": f"{folder}/policy.tflite"})

    (tmp_path / "baseline").mkdir()
    for name in ("weights.npz", "replay.npz"):
        (tmp_path / "baseline" / name).write_bytes(b"x")
    stages = Stages(tmp_path)
    for name, outputs in [("train", Outputs()), ("export", artifacts("baseline")), ("variant:a", artifacts("variants/a")),
                          ("memory:a", Outputs()), ("variant:b", artifacts("variants/b")), ("reference:200", Outputs()),
                          ("look:200:a", Outputs()), ("look:200:b", Outputs()), ("measure:a", Outputs())]:
        stages.finish(name, outputs)
    assert stages.forget_missing() == []
    (tmp_path / "variants" / "a" / "policy.tflite").unlink()
    assert stages.forget_missing() == ["variant:a", "memory:a", "look:200:a", "measure:a"]
    assert list(Stages(tmp_path).done) == ["train", "export", "variant:b", "reference:200", "look:200:b"]
    (tmp_path / "baseline" / "replay.npz").unlink()
    assert stages.forget_missing() == ["train", "export", "variant:b", "reference:200", "look:200:b"]


def test_a_second_process_on_the_same_run_directory_is_refused(tmp_path):
    """Its resume deleted the first one's live temporaries and interleaved stages.json writes."""
    import textwrap

    from compress_dqn.fileio import lock_run_dir

    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)  # the holder may ask again
    code = textwrap.dedent(f"""
        from compress_dqn.fileio import lock_run_dir
        lock_run_dir({str(tmp_path)!r})
    """)
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and "another compress-dqn process is using this run directory" in other.stderr


def test_the_one_yaml_loader_of_our_own_is_a_safe_loader():
    """RL Zoo configs hold python/ tags that safe_load refuses: port/zoo_config.py reads them with a SafeLoader
    that turns those tags into plain data, and must never build an object."""
    import yaml

    from compress_dqn.port import zoo_config as sb3

    assert issubclass(sb3._ZooLoader, yaml.SafeLoader)
    text = "!!python/object/apply:os.system ['echo pwned']\n"
    assert sb3._zoo_document(text) == ["echo pwned"]  # the tag's arguments as data; nothing ran
