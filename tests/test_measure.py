"""Measurement on tiny artifacts: positive, consistent figures; the TFLite probe stays TensorFlow-free."""

import json
import time

import numpy as np
import pytest

from compress_dqn.compress.quantize import converter_setup
from compress_dqn.convert.conversion import convert_tflite, export_saved_model
from compress_dqn.fileio import write_bytes_atomic
from compress_dqn.evaluation.measure import gzip_bytes, measure_latency, measure_memory
from compress_dqn.rl.networks import build_q_network
from compress_dqn.convert.loading import load_policy
from compress_dqn.recipe.schema import QuantizeConfig


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("measure")
    model = build_q_network((4,), 2, [128, 128])
    export_saved_model(model, (4,), np.float32, out / "sm")
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    write_bytes_atomic(out / "fp32.tflite", convert_tflite(out / "sm"))
    write_bytes_atomic(out / "int8.tflite", convert_tflite(out / "sm", converter_setup(QuantizeConfig(mode="int8"), obs)))
    sparse = build_q_network((4,), 2, [128, 128])
    sparse.set_weights([np.where(np.random.default_rng(1).random(w.shape) < 0.9, 0.0, w) for w in model.get_weights()])
    export_saved_model(sparse, (4,), np.float32, out / "sparse_sm")
    write_bytes_atomic(out / "sparse.tflite", convert_tflite(out / "sparse_sm"))
    return out, obs


def test_sizes_are_consistent(artifacts):
    out, _ = artifacts
    fp32, int8, sparse = (out / f"{n}.tflite" for n in ("fp32", "int8", "sparse"))
    assert int8.stat().st_size < 0.5 * fp32.stat().st_size
    assert gzip_bytes(sparse) < 0.5 * gzip_bytes(fp32)  # sparsity shows once compressed
    assert abs(sparse.stat().st_size - fp32.stat().st_size) < 0.05 * fp32.stat().st_size  # ...and not before


def test_latency_is_positive_and_ordered(artifacts):
    out, obs = artifacts
    stats = measure_latency(load_policy(out / "int8.tflite"), obs, calls=300, warmup=20)
    assert 0 < stats.p50 <= stats.p99 and stats.calls == 300 and stats.batch256_obs_per_s > 0
    saved = measure_latency(load_policy(out / "sm"), obs, calls=300, warmup=20)
    assert saved.p50 > stats.p50  # TensorFlow's per-call overhead dwarfs a TFLite invoke


class _SleepyPolicy:
    """A policy whose every action takes ~1 ms, like a SavedModel call."""

    def __init__(self) -> None:
        self.acted = 0

    def act(self, obs: np.ndarray) -> int:
        self.acted += 1
        time.sleep(0.001)
        return 0

    def actions(self, batch: np.ndarray) -> np.ndarray:
        return np.zeros(len(batch), dtype=np.int64)


def test_a_latency_budget_stops_slow_calls_early_but_keeps_at_least_min_calls():
    obs = np.zeros((10, 4), dtype=np.float32)
    slow = _SleepyPolicy()
    stats = measure_latency(slow, obs, calls=2000, warmup=1000, seconds=0.2, min_calls=100)
    assert 100 <= stats.calls < 400 and stats.p50 >= 1000  # ~0.2 s of ~1.1 ms calls, not 2,000
    assert slow.acted < 500  # the warm-up stopped after ~0.05 s too
    floor = measure_latency(_SleepyPolicy(), obs, calls=2000, warmup=5, seconds=0.01, min_calls=150)
    assert floor.calls == 150  # the budget ran out first: min_calls still holds
    unbudgeted = measure_latency(_SleepyPolicy(), obs, calls=120, warmup=5)
    assert unbudgeted.calls == 120


def test_tflite_memory_probe_does_not_import_tensorflow(artifacts):
    out, _ = artifacts
    lite = measure_memory(out / "int8.tflite", "tflite", steps=100)
    assert lite["imports_tensorflow"] is False
    assert lite["peak_rss"] >= lite["process_baseline_rss"] > 0
    served = measure_memory(out / "sm", "saved_model", steps=100)
    assert served["imports_tensorflow"] is True
    assert served["peak_rss"] > 2 * lite["peak_rss"]


def test_bench_cli_prints_json(artifacts):
    """In-process through click's runner (the command's exit status and stderr as a shell sees them; a fresh
    interpreter per call added its imports): test_cli runs the CLI as a user's process."""
    from click.testing import CliRunner

    from compress_dqn.cli import main

    out, _ = artifacts
    result = CliRunner().invoke(main, ["bench", str(out / "int8.tflite"), "--calls", "200"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    report = json.loads(result.stdout)
    assert report["runtime"] == "tflite" and report["size"]["bytes"] > 0
    assert report["latency_us"]["p50"] > 0 and report["memory_bytes"]["imports_tensorflow"] is False
    litert = report["litert_us"]  # LiteRT's own cost beside act(): the loader's overhead in plain sight
    assert 0 < litert["invoke_p50"] < litert["set_invoke_get_p50"]
    assert litert["act_overhead_us"] == pytest.approx(litert["act_p50"] - litert["set_invoke_get_p50"])
    bad = CliRunner().invoke(main, ["bench", str(out / "missing.tflite")])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ")


def test_gpu_measurement_is_none_without_a_gpu(artifacts):
    from compress_dqn._tf import tf
    from compress_dqn.convert.saved_model import gpu_note, measure_gpu

    out, obs = artifacts
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible: the CPU fallback does not apply")
    assert measure_gpu(out / "sm", obs) is None
    assert gpu_note() == "no GPU on this machine"


def test_gpu_measurement_path_records_latency_and_peak(artifacts, monkeypatch):
    """The GPU branch's logic, run on CPU: device listing and allocator stats are faked, and soft
    device placement runs the ops on the CPU."""
    from compress_dqn._tf import tf
    from compress_dqn.convert.saved_model import measure_gpu

    out, obs = artifacts
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["fake-gpu"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(tf.config.experimental, "get_memory_info",
                        lambda device: calls.append(("read", device)) or {"current": 1, "peak": 12345})
    result = measure_gpu(out / "sm", obs, calls=200)
    assert result.peak_bytes == 12345 and result.device == "GPU:0"
    assert result.latency.p50 > 0
    assert calls == [("reset", "GPU:0"), ("read", "GPU:0")]  # reset before loading, read after acting


def test_act_costs_little_over_litert_s_own_set_invoke_get(artifacts):
    """act() adds a view and a Python call to set_tensor+invoke+get_tensor: well under a microsecond
    (the bound is loose for a loaded test machine; the brief's ~0.5 us is measured by bench)."""
    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.evaluation.measure import compare_with_litert

    out, obs = artifacts
    for name in ("fp32.tflite", "int8.tflite"):
        figures = compare_with_litert(TFLitePolicy(out / name), (out / name).read_bytes(), obs, rounds=5, per_round=200)
        assert figures["act_overhead_us"] < 2.0, (name, figures)
