"""The CLI end to end on the tiny recipe: run, results.json, resume after kill -9, evaluate."""

import json
import signal
import subprocess
import sys
import time

import pytest

from click.testing import CliRunner

from compress_dqn.cli import main
from conftest import NO_C_FIGURES, NO_TF_MEMORY, ROOT, TINY, cli


def test_run_writes_results_and_rerun_resumes(finished_tiny_run, tmp_path):
    """finished_tiny_run is `compress-dqn run recipes/tiny.yaml --out RUN --quiet` in a fresh process."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_tiny_run, out)  # the rerun below works on a copy of the shared run
    results = json.loads((out / "results.json").read_text())
    assert results["schema_version"] == 3 and results["env_id"] == "CartPole-v1"
    assert results["eval"] == {"episodes": 5, "seed": 0, "max_episodes": 5, "looks": [5], "confidence": 0.95,
                               "tolerance": 0.01, "heldout_seed": 1_000_000, "heldout_episodes": 10}
    assert len(results["random"]["return"]["episodes"]) == 5
    (baseline,) = results["variants"]
    assert baseline["name"] == "baseline"
    assert (out / baseline["artifacts"]["tflite"]).is_file()
    assert (out / baseline["artifacts"]["saved_model"] / "saved_model.pb").is_file()
    assert len(baseline["return"]["episodes"]) == 5
    lo, hi = baseline["return"]["ci95"]
    assert lo <= baseline["return"]["mean"] <= hi
    size = baseline["size"]
    assert size["params"] == (4 * 16 + 16) + (16 * 16 + 16) + (16 * 2 + 2)
    assert 0 < size["tflite_gzip_bytes"] < size["tflite_bytes"]
    assert size["saved_model_bytes"] > 0
    for runtime in ("tflite", "saved_model"):
        latency = baseline["latency_us"]["cpu"][runtime]
        assert 0 < latency["p50"] <= latency["p99"] and 500 <= latency["calls"] <= 2000  # 0.5 s of calls, >= 500
        memory = baseline["memory_bytes"]["cpu_rss"][runtime]
        assert memory["peak_rss"] >= memory["process_baseline_rss"] > 0
    assert baseline["memory_bytes"]["cpu_rss"]["tflite"]["imports_tensorflow"] is False
    assert baseline["memory_bytes"]["cpu_rss"]["saved_model"]["imports_tensorflow"] is True
    if results["gpu"] == "no GPU on this machine":
        assert baseline["latency_us"]["gpu"] is None and baseline["memory_bytes"]["gpu_peak"] is None
    assert list((out / "tensorboard" / "baseline").glob("events.out.tfevents.*"))
    assert (out / "recipe.yaml").is_file()

    # Rerunning the same command redoes nothing and gives the same results.
    again = cli("run", str(TINY), "--out", str(out), "--quiet")
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "results.json").read_text()) == results
    assert "trained" not in again.stderr

    # The policy evaluates through the CLI, deterministically; this and the refusal below go through
    # click's runner (the CLI's own code, exit code and streams), sparing two TensorFlow imports: the
    # rerun above and test_bad_inputs_exit_2_without_traceback check the CLI as a user's process.
    evaluated = CliRunner().invoke(main, ["evaluate", str(out / "baseline" / "policy.tflite"), "--env", "CartPole-v1",
                                          "--episodes", "5"])
    assert evaluated.exit_code == 0, (evaluated.output, evaluated.exception)
    assert json.loads(evaluated.stdout)["return"]["episodes"] == baseline["return"]["episodes"]

    # A different recipe in the same directory is refused, and nothing is touched.
    other = CliRunner().invoke(main, ["run", str(TINY), "--out", str(out), "--set", "train.gamma=0.5"])
    assert other.exit_code == 2
    assert "holds a run of a different recipe (train.gamma: 0.99 -> 0.5)" in other.stderr
    assert json.loads((out / "results.json").read_text()) == results


@pytest.mark.slow
def test_kill_during_training_then_rerun_resumes(tmp_path):
    out = tmp_path / "run"
    args = ["run", str(TINY), "--out", str(out), "--set", "train.total_timesteps=1000", "--set",
            "train.checkpoint_interval=100", "--set", NO_TF_MEMORY, "--set", NO_C_FIGURES]  # it reads no memory or C figure
    proc = subprocess.Popen([sys.executable, "-m", "compress_dqn", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latest = out / "baseline" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "results.json").exists()
    from click.testing import CliRunner

    from compress_dqn.cli import main

    resumed = CliRunner().invoke(main, args)  # the CLI's own code in this process: no second TensorFlow import
    assert resumed.exit_code == 0, (resumed.output, resumed.exception)
    assert "resuming from checkpoint at step" in resumed.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["env_steps"] == 1000
    assert results["train"]["resumed_from_step"] > 0
    assert not (out / "baseline" / "checkpoints").exists()


def test_bad_inputs_exit_2_without_traceback(tmp_path):
    """One case through a real process (its exit status and stderr as a shell sees them); the
    others through click's runner, which shows the same exit code and stderr in-process."""
    from click.testing import CliRunner

    from compress_dqn.cli import main

    missing = cli("run", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1
    bad_png = tmp_path / "x.tflite"
    bad_png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    for args in (["evaluate", str(bad_png), "--env", "CartPole-v1"], ["evaluate", str(bad_png), "--env", "NoSuchEnv-v0"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert "Traceback" not in result.output
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    bad_env = tmp_path / "r.yaml"
    bad_env.write_text("env: {id: Pendulum-v1}\n")
    result = CliRunner().invoke(main, ["run", str(bad_env), "--out", str(tmp_path / "never")])
    assert result.exit_code == 2 and "Discrete action space" in result.stderr
    assert not (tmp_path / "never").exists()


def test_more_bad_inputs_get_one_line_and_exit_2(tmp_path):
    """Found by trying to break the CLI: each of these gave a traceback (exit 1) or was accepted."""
    from click.testing import CliRunner

    from compress_dqn.cli import main

    def run(*args: str):
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert "Traceback" not in result.output and result.stderr.count("\n") == 1, result.stderr
        return result.stderr

    def recipe(name: str, text: str) -> str:
        (tmp_path / name).write_text(text)
        return str(tmp_path / name)

    assert "env.max_episode_steps: 0 must be >= 1" in run("validate", recipe("a.yaml", "env: {id: CartPole-v1, max_episode_steps: 0}\n"))
    assert "rejected them (gravity" in run("validate", recipe("b.yaml", "env: {id: LunarLander-v3, kwargs: {gravity: 5}}\n"))
    assert "must be <= 4294967295" in run("validate", recipe("c.yaml", "env: {id: CartPole-v1}\nseed: 4294967296\n"))
    assert "duplicate key 'train' at line 3" in run(
        "validate", recipe("d.yaml", "env: {id: CartPole-v1}\ntrain: {total_timesteps: 1000}\ntrain: {batch_size: 8}\n"))
    assert "--set env.kwargs.x: a YAML anchor refers to itself" in run("validate", str(TINY), "--set", "env.kwargs.x=&a [*a]")
    assert "not a regular file" in run("validate", "/dev/zero")
    assert "use --set 'seeds=[7]'" in run("validate", recipe("e.yaml", "env: {id: CartPole-v1}\nseeds: [0, 1]\n"), "--seed", "7")
    (tmp_path / "afile").write_text("x")
    assert "afile: is a file, not a run directory" in run("run", str(TINY), "--out", str(tmp_path / "afile"))
    assert "Not a directory; check the path" in run("run", str(TINY), "--out", str(tmp_path / "afile" / "sub"))
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "stages.json").write_text("garbage{")
    assert "stages.json: unreadable" in run("run", str(TINY), "--out", str(tmp_path / "r"))


def test_a_run_refused_before_its_first_stage_takes_the_corrected_recipe(tmp_path):
    """`--set device=gpu` without a GPU, or a typo found after recipe.yaml was written, used to leave a
    directory that refused the corrected rerun as 'a run of a different recipe'."""
    import pytest

    from compress_dqn.errors import UserError
    from compress_dqn.run.rundir import prepare_run_dir
    from compress_dqn.recipe.schema import load_recipe

    first, fixed = load_recipe(TINY, ["eval.episodes=3"]), load_recipe(TINY, ["eval.episodes=4"])
    run_dir = tmp_path / "r"
    assert prepare_run_dir(first, run_dir) is False
    assert prepare_run_dir(fixed, run_dir) is False  # nothing started: the corrected recipe replaces it
    assert "episodes: 4" in (run_dir / "recipe.yaml").read_text()
    (run_dir / "baseline").mkdir()
    (run_dir / "baseline" / "weights.npz").write_bytes(b"x")
    with pytest.raises(UserError, match="holds a run of a different recipe"):
        prepare_run_dir(first, run_dir)
