"""Every benchmarks/ script runs at its --smoke size and prints the JSON its docs promise.

A refactor that breaks a benchmark fails here, not months later when someone reruns a study.
Each runs as `python benchmarks/NAME.py --smoke` runs it: its __main__ block with that argv. Most run
in the test's own interpreter (runpy), so the TensorFlow this worker already imported is not imported
again (~6 s of CPU a script); a script whose figures need a process of its own (a memory reading) runs
in a fresh interpreter, `fresh=True`. The processes a script starts itself (a seed's training, a C
player, a killed run, a spawned pool's workers, Ray's) stay processes either way.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def bench(name: str, *args: str, cwd: Path = ROOT, timeout: float = 600, fresh: bool = False) -> list[dict]:
    """Run benchmarks/NAME.py --smoke ARGS; its stdout's JSON lines (every line must be one)."""
    script = ROOT / "benchmarks" / f"{name}.py"
    if fresh:
        done = subprocess.run([sys.executable, str(script), "--smoke", *args],
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-2000:]
        stdout = done.stdout
    else:
        stdout = run_script(script, ["--smoke", *args], cwd, timeout)
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "printed nothing"
    return [json.loads(line) for line in lines]


def run_script(script: Path, args: list[str], cwd: Path, timeout: float) -> str:
    """`python SCRIPT ARGS` in this interpreter: its stdout; exit code 0 (or none) and within `timeout`
    seconds asserted. What a script changes of the interpreter's state is put back: argv, the working
    directory, sys.path (scripts put the repository on it) and the imports it blocked (a None entry in
    sys.modules: SB3's TensorBoard writer), so the next test in this worker sees what it saw before."""
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), Path.cwd()
    blocked = {k for k, v in sys.modules.items() if v is None}
    out = io.StringIO()
    start = time.monotonic()
    try:
        sys.argv = [str(script), *args]
        os.chdir(cwd)
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        assert exc.code in (None, 0), f"{script.name} exited with {exc.code!r}"
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        for key in [k for k, v in sys.modules.items() if v is None and k not in blocked]:
            del sys.modules[key]
    assert time.monotonic() - start <= timeout, f"{script.name} took over {timeout} s"
    return out.getvalue()


def test_replay_memory_compresses_real_atari_frames_and_samples_them_identically():
    """Smoke size: 3,000 rows of Pong, compressed, timed against the uncompressed buffer on the
    same indices. It crashed at zip(*batch) once, when Batch grew an n-step field."""
    (row,) = bench("replay_memory", fresh=True)  # its RSS figures are its own process's
    assert row["game"] == "Pong" and row["capacity"] == 3000 and row["codec"] == "zstd"
    assert row["identical"] is True and row["evicted_rows"] == 0
    assert 0 < row["num_transitions"] < row["capacity"] <= row["env_steps"]
    assert row["bytes_per_transition"] < row["uncompressed_bytes_per_transition"] / 4  # far below one 7 KB frame
    assert row["uncompressed_bytes_per_transition"] > 84 * 84
    assert 0 < row["sample_us_min"] <= row["sample_us"] and 0 < row["sample_cpu_us"] and row["uncompressed_sample_us"] > 0 and row["rss_bytes"] > row["rss_added_bytes"] > 0


def test_verdict_calibration_gives_shares_per_case():
    rows = bench("verdict_calibration")
    assert [r["case"] for r in rows] == ["rare failures"] * 3 + ["identical"] + ["spread"] * 2
    for row in rows:
        assert math.isclose(sum(row["shares"].values()), 1.0)
        assert set(row["shares"]) <= {"within 1%", "worse", "better", "inconclusive"}
        assert row["median_episodes"] <= row["looks"][-1]


def test_train_cartpole_reports_a_seed_and_a_summary():
    row, summary = bench("train_cartpole")
    assert row["seed"] == 0 and row["env_steps"] == 300 and row["gradient_steps"] > 0
    assert row["recipe"].endswith("tiny.yaml") and row["rss_50pct_bytes"] and row["rss_100pct_bytes"]
    assert summary["summary"] and summary["seeds"] == 1 and summary["failed"] == 0
    assert summary["mean_return"] == row["eval_mean_return"]


def test_lunarlander_options_reports_an_option_set_and_its_summary():
    row, summary = bench("lunarlander_options")
    assert row["option"] == summary["option"] == "n3-double-64x64-200k"
    assert row["env_steps"] == 300 and row["eval_episodes"] == 2 and "error" not in row
    assert summary["seeds"] == 1 and summary["failed"] == 0 and summary["solved_at"] == 200.0


def test_student_replicas_decides_each_replica_and_each_best_of_k(tmp_path):
    rows = bench("student_replicas", "--out", str(tmp_path / "replicas"))
    variants = [r for r in rows if "variant" in r]
    assert [v["variant"] for v in variants] == ["sel1-a", "sel1-b"]
    assert all(v["verdict"] in ("within 1%", "worse", "better", "inconclusive") for v in variants)
    assert any("spearman_fresh_vs_final" in r and r["fresh_episodes"] == 4 for r in rows)
    assert [(r["setting"], r["best_of"], r["subsets"]) for r in rows if "best_of" in r] == [("sel1", 1, 2), ("sel1", 2, 1)]


def test_compare_executors_finds_the_same_per_seed_results_on_a_pool_and_on_ray(tmp_path):
    """recipes/sweep.yaml's contract, shrunk: 2 seeds on a 2-worker pool and on a local Ray give the
    same per-seed results, and the seeds really differ."""
    pytest.importorskip("ray")
    *engines, summary = bench("compare_executors", "--out", str(tmp_path / "compare"), cwd=tmp_path)
    assert [e["engine"] for e in engines] == ["local:2", "ray"] and all(e["seeds"] == [0, 1] for e in engines)
    assert summary["identical_per_seed_results"] is True and summary["seeds_differ"] is True
    assert set(summary["mean_returns"]["0"]) == {"baseline", "ptq-float16"}


def test_kill_resume_resumes_a_killed_run_to_the_references_bytes(tmp_path):
    *trials, summary = bench("kill_resume", "--out", str(tmp_path / "kill"))
    assert summary["kills"] >= 1 and summary["trials"] == len(trials)
    assert summary["verified"] == summary["identical"] == summary["trials"], trials
    assert all(t["resumed"] and t["identical_to_reference"] and t["error"] is None for t in trials)


def test_byo_baseline_compresses_a_runs_keras_file_again(finished_tiny_run, tmp_path):
    (row,) = bench("byo_baseline", "--run", str(finished_tiny_run), "--out", str(tmp_path / "byo"))
    assert row["env_id"] == "CartPole-v1" and row["seed"] == 0
    (baseline,) = row["variants"].values()
    assert set(baseline) == {"full_pipeline", "from_keras", "relative_difference", "within_1pct"}
    assert row["all_within_1pct"] == baseline["within_1pct"]
    assert (tmp_path / "byo" / "baseline.keras").is_file() and (tmp_path / "byo" / "run" / "results.json").is_file()


def test_atari_zoo_plays_sb3s_returns_and_gets_a_verdict(tmp_path):
    """An SB3 CnnPolicy trained 300 steps, ported: SB3's returns episode by episode, and a ptq-int8 verdict."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("ale_py")
    (row,) = bench("atari_zoo", "--out", str(tmp_path / "zoo"))
    assert row["env_id"] == "SpaceInvadersNoFrameskip-v4" and row["seeds"] == [0]
    assert row["sb3_policy_on_compress_dqn_env"] == row["sb3_returns"] and row["env_equal"]
    assert row["compress_dqn_baseline_returns"] == row["sb3_returns"] and row["baseline_equal"]
    assert row["port_check"]["checked"] and row["port_check"]["action_agreement"] == 1.0
    assert row["preprocessing"].startswith("Atari preprocessing: SB3's AtariWrapper") and "bare zip" in row["preprocessing"]
    assert row["ptq_int8"]["tolerance"] == 0.05
    assert row["ptq_int8"]["verdict"] in {"within 5%", "better", "worse", "inconclusive"}


def test_rl_zoo_agents_runs_a_generated_qrdqn_zip_through_compress(tmp_path):
    """A tiny untrained QR-DQN zip stands in for rl-trained-agents: ported, checked against sb3-contrib, compressed."""
    pytest.importorskip("sb3_contrib")
    row, summary = bench("rl_zoo_agents", "--out", str(tmp_path / "zoo"))
    assert (row["algo"], row["env_id"], row["played_on"]) == ("qrdqn", "CartPole-v1", "CartPole-v1")
    assert row["command"].startswith("compress-dqn compress ") and "--variants ptq-int8" in row["command"]
    assert row["port_check"]["checked"] and "sb3-contrib" in row["port_check"]["runtime"] and row["ported"]
    assert row["baseline"]["episodes"] == 2 and row["zoo_benchmark"] == {"mean": 500.0, "std": 0.0}
    assert summary["summary"] and summary["agents"] == summary["ported"] == 1


def test_ship_targets_reports_c_onnx_and_q_values_per_policy(tiny_variants_run):
    """Smoke size: the session's tiny variants run (no run built here), its baseline and ptq-int8, 2 episodes."""
    rows = bench("ship_targets", str(tiny_variants_run), "--variants", "baseline,ptq-int8")
    assert [r["variant"] for r in rows] == ["baseline", "ptq-int8"]
    for row in rows:
        c = row["c"]
        assert c["identical_episode_by_episode"] and c["differing_steps"] == 0 and c["integer_only"] == (row["variant"] != "baseline")
        assert c["flash_ram"]["measured"] and set(c["flash_ram"]["targets"]) == {"cortex-m0plus", "cortex-m4f"}
        assert c["time_per_action"]["c_ns"] > 0 and c["time_per_action"]["litert_invoke_ns"] > 0
        assert row["onnx"]["identical"] and row["q_values"]["identical"] and row["q_values"]["steps_where_argmax_differs"] == 0


def test_minatar_students_builds_a_float_student_on_a_minatar_baseline_and_decides_it(tmp_path):
    (row,) = bench("minatar_students", "--run", str(tmp_path / "students"))
    assert row["name"] == "smoke-c4-8" and row["verdict"] in ("within 1%", "worse", "better", "inconclusive")
    assert row["params"] < 3000 and row["ratio"] > 1 and row["episodes"] == 5
    assert [step for step, _ in row["curve"]] == [0, 100, 200]


def test_minatar_int8_layers_names_the_component_that_flips_actions():
    """Smoke size: a random float CNN student exported as compress-dqn does, its weights found by
    the graph, its numpy forward pass checked against LiteRT, then each int8 component alone."""
    header, *rows = bench("minatar_int8_layers")
    assert header["states"] == 500 and header["float_check"]["max_abs_difference"] <= 1e-3
    assert header["float_check"]["litert_action_agreement"] == 1.0
    assert header["shapes"] == {"conv": [4, 3, 3, 4], "hidden": [16, 256], "advantage": [3, 16], "value": [1, 16]}
    assert header["activation_ranges"]["conv"][0] == 0 < header["activation_ranges"]["conv"][1]
    assert [r["quantized"] for r in rows] == [
        "conv weights", "hidden weights per unit", "hidden weights per tensor", "head weights", "conv activations",
        "hidden activations", "head outputs", "body", "body, hidden weights per tensor", "everything"]
    for row in rows:  # every row quantizes something: its advantages move, if not its actions
        assert 0 <= row["agreement"] <= 1 and 0 < row["advantage_error"] < 0.1, row
    named = {r["quantized"]: r for r in rows}
    everything = named["everything"]
    assert everything["agreement"] <= 1
    parts = ("conv weights", "hidden weights per unit", "head weights", "head outputs")  # all in "everything"
    assert everything["advantage_error"] >= max(named[p]["advantage_error"] for p in parts) / 2


def test_onnx_exactness_counts_the_actions_each_onnx_form_changes(tiny_variants_run):
    """Smoke size: the tiny run's ptq-int8 on 256 states, both forms; the exact form changes none."""
    policy = tiny_variants_run / "variants" / "ptq-int8" / "policy.tflite"
    prepared, *rows, cpu = bench("onnx_exactness", str(policy))
    assert prepared == {"policy": str(policy), "name": "ptq-int8", "states": 256}
    assert [(r["policy"], r["form"]) for r in rows] == [("ptq-int8", "exact"), ("ptq-int8", "qdq")]
    assert all(r["states"] == 256 and r["bytes"] > r["gzipped_bytes"] > 0 and r["p50_us_batch1"] > 0 for r in rows)
    assert rows[0]["differ_default"] == rows[0]["differ_optimizations_off_batch"] == 0
    assert cpu["AVX2"] in (True, False) and "onnxruntime" in cpu


def test_spaceinvaders_lanes_plays_the_same_episodes_in_numpy_lanes_and_in_minatar():
    """Smoke size: 24 seeds checked (returns, lengths, observation hashes), 12 episodes timed once
    per player, with the scripted player (no policy file, no TensorFlow)."""
    check, *runs, summary = bench("spaceinvaders_lanes", timeout=60)
    assert check["check"] and check["episodes"] == 24 and check["steps"] > 24 and not check["differing_seeds"]
    assert sorted(r["player"] for r in runs) == ["gym_lanes", "numpy_lanes", "one_at_a_time"]
    assert summary["policy"] == "scripted" and summary["episodes"] == 12 and all(summary["identical"].values())
    assert summary["speedup_numpy_lanes_vs_one_at_a_time"] > 0


def test_structured_ranks_starts_students_fresh_and_narrowed_and_distils_them():
    rows = bench("structured_ranks")
    assert [(r["student"]["net_arch"], r["start"]) for r in rows] == [([8, 8], "fresh"), ([8, 8], "gap")]
    for row in rows:
        assert row["steps"] == 50 and 0 <= row["agreement_after"]["decisive"] <= 1 and row["distill_seconds"] > 0


def test_keras3_cartpole_trains_in_keras3_and_compresses_its_keras_and_h5_files(tmp_path):
    """Smoke size: a 16-unit Keras 3 DQN, 1,500 steps; its .keras and .h5 through compress, each port-checked
    against Keras 3, the .keras with a 300-step student decided at 1%."""
    pytest.importorskip("keras", minversion="3")
    trained, keras_file, h5, summary = bench("keras3_cartpole", "--out", str(tmp_path / "k3"))
    assert trained["steps"] == 1500 and trained["keras_version"].startswith("3.") and not trained["summary"]
    assert [keras_file["file"], h5["file"]] == ["q.keras", "q.h5"]
    for row, kind in ((h5, "h5"), (keras_file, "keras")):
        assert row["ported"] and row["port_check"]["format"] == f"a Keras 3 .{kind} file", row
        assert row["port_check"]["runtime"].startswith("keras 3.") and row["port_check"]["max_abs_q_diff"] <= 1e-4
    assert keras_file["variants"][0]["name"] == "student-32x32-qat-int8" and keras_file["variants"][0]["tolerance"] == 0.01
    assert summary["summary"] and summary["ported"] == 2 and summary["student_verdict"] in (
        "within 1%", "worse", "better", "inconclusive")


def test_your_environment_trains_sb3_on_a_package_id_and_compresses_it_on_a_pool(tmp_path):
    """Smoke size: an SB3 DQN on the in-repository envpkg.corridor:Corridor-v0 (kwargs, time limit), compressed
    with ptq-int8 through package:Id on a pool of 2 workers that import the module themselves."""
    pytest.importorskip("stable_baselines3")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "your_environment.py"), "--smoke",
                           "--env", "envpkg.corridor:Corridor-v0", "--kwargs", '{"length": 6}', "--max-episode-steps",
                           "30", "--out", str(tmp_path / "corridor")], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["sb3_steps"] == 300 and row["kwargs"] == {"length": 6}
    assert row["port_check"]["checked"] and row["port_check"]["max_abs_q_diff"] <= 1e-4
    assert [p["name"] for p in row["policies"]] == ["baseline", "ptq-int8"]
