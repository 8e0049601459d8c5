"""Microcontroller export: measured flash and arena, C++ that compiles, TFLM plays as LiteRT does."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.deploy import micro
from compress_dqn.deploy.base import ExportOptions
from compress_dqn.deploy.micro.cpp import export as micro_export
from compress_dqn.cli import main
from compress_dqn.errors import UserError

needs_tflm = pytest.mark.skipif(not micro.available(), reason="tflite-micro not installed: pip install 'compress-dqn[micro]'")


def _export(model, path: Path, configure=None) -> Path:
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model

    saved = export_saved_model(model, (4,), np.float32, path.with_suffix(".sm"))
    path.write_bytes(convert_tflite(saved, configure))
    return path


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """CartPole-sized policies: int8 (float io, split head, as the pipeline exports), fp32, dynamic-range,
    an fp32 one with 16 distinct weights per layer (as clustering leaves it), and one with REDUCE_PROD."""
    if not micro.available():
        pytest.skip("tflite-micro not installed: pip install 'compress-dqn[micro]'")
    from compress_dqn._tf import tf, tf_keras
    from compress_dqn.compress.quantize import FLOAT_HEADS, calibrate_ranges, converter_setup, qat_model
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.rl.networks import build_q_network
    from compress_dqn.recipe.schema import QuantizeConfig

    out = tmp_path_factory.mktemp("micro")
    tf_keras.utils.set_random_seed(3)
    model = split_value_advantage(build_q_network((4,), 2, [32, 32]))
    calibration = np.random.default_rng(0).normal(0, 1, size=(200, 4)).astype(np.float32)
    qat = qat_model(model)  # QAT keeps the split head's sum in float: q = deq(advantage) + deq(value)
    calibrate_ranges(qat, model, calibration)
    paths = {
        "int8": _export(model, out / "int8.tflite", converter_setup(QuantizeConfig(mode="int8"), calibration)),
        "qat": _export(qat, out / "qat.tflite", converter_setup(QuantizeConfig(mode="qat"))),
        # quantize.float_head: an int8 body feeding float advantage and value heads.
        "qat-fhead": _export(_calibrated(qat_model(model, float_layers=FLOAT_HEADS), model, calibration),
                             out / "qat-fhead.tflite", converter_setup(QuantizeConfig(mode="qat", float_head=True))),
        "fp32": _export(model, out / "fp32.tflite"),
        "dynamic": _export(model, out / "dynamic.tflite", converter_setup(QuantizeConfig(mode="dynamic"))),
    }
    clustered = build_q_network((4,), 2, [64, 64])
    for layer in clustered.layers:
        if layer.get_weights():
            kernel, bias = layer.get_weights()
            levels = np.quantile(kernel, np.linspace(0, 1, 16))
            layer.set_weights([levels[np.abs(kernel[..., None] - levels).argmin(-1)].astype(np.float32), bias])
    paths["clustered"] = _export(clustered, out / "clustered.tflite")
    pruned = build_q_network((4,), 2, [64, 64])  # 90% zeros, stored as the pipeline does when smaller
    pruned.set_weights([np.where(np.random.default_rng(1).random(w.shape) < 0.9, 0.0, w) for w in pruned.get_weights()])
    paths["sparse"] = _export(pruned, out / "sparse.tflite", converter_setup(None, sparse=True))

    class Prod(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="observations")])
        def serve(self, observations):
            q = tf.concat([tf.reduce_prod(observations, axis=1, keepdims=True), observations[:, :1]], axis=1)
            return {"q_values": q, "action": tf.argmax(q, axis=-1, output_type=tf.int32)}

    module = Prod()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    paths["prod"] = out / "prod.tflite"
    paths["prod"].write_bytes(converter.convert())
    # As the pipeline exports a normalized int8 policy: calibrated on (obs - mean) / std, which the
    # file computes itself in front of its input (graph_input.py).
    from compress_dqn.deploy.tflite.graph_input import carry_input_normalization
    from compress_dqn.compress.rewrites import normalize_model_input
    from compress_dqn.envs.normalization import Normalization

    norm = Normalization(np.array([0.1, -0.5, 0.02, 0.3], np.float32), np.array([2.0, 1.0, 0.05, 0.5], np.float32))
    folded = normalize_model_input(model, norm)
    raw = _export(folded, out / "normalized_graph.tflite", converter_setup(QuantizeConfig(mode="int8"), calibration))
    paths["normalized"] = out / "normalized.tflite"
    paths["normalized"].write_bytes(carry_input_normalization(raw.read_bytes(), norm))
    return paths


def _calibrated(qat, model, calibration):
    from compress_dqn.compress.quantize import calibrate_ranges

    calibrate_ranges(qat, model, calibration)
    return qat


def _cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@needs_tflm
def test_summary_measures_flash_arena_and_ops(policies):
    summary = micro.micro_summary(policies["int8"])
    assert summary.runs and summary.reason is None
    assert summary.flash_bytes == policies["int8"].stat().st_size
    assert 0 < summary.arena_bytes < summary.arena_bytes_with_margin <= 32 * 1024
    assert summary.fits == {"32KB": True, "256KB": True}
    assert {"QUANTIZE", "FULLY_CONNECTED", "ARG_MAX", "ADD", "DEQUANTIZE"} == set(summary.ops)
    # Measured, not guessed: TFLM runs in an arena of exactly that size and not in one byte less.
    data = policies["int8"].read_bytes()
    probe = micro.ArenaProbe(data, 1)
    try:
        assert probe.runs(summary.arena_bytes) and not probe.runs(summary.arena_bytes - 1)
    finally:
        probe.close()
    assert micro.micro_summary(data) == summary  # bytes work as a path does


@needs_tflm
def test_summary_never_raises_for_models_tflm_cannot_run(policies, tmp_path):
    prod = micro.micro_summary(policies["prod"])
    assert not prod.runs and "REDUCE_PROD" in prod.reason and "REDUCE_PROD" in prod.ops
    assert prod.arena_bytes is None and prod.fits == {"32KB": False, "256KB": False}
    dynamic = micro.micro_summary(policies["dynamic"])
    assert not dynamic.runs and "FULLY_CONNECTED" in dynamic.reason and "int8" in dynamic.reason
    # The sparse format's kernels hold only their nonzero blocks: not damaged, but TFLM cannot expand them.
    sparse = micro.micro_summary(policies["sparse"])
    assert not sparse.runs and "DENSIFY" in sparse.ops, sparse
    assert "damaged" not in sparse.reason and "prune.sparse_format: false" in sparse.reason
    (tmp_path / "junk.tflite").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    junk = micro.micro_summary(tmp_path / "junk.tflite")
    assert not junk.runs and "not a TFLite flatbuffer" in junk.reason


class LiteRTBuiltin:
    """LiteRT with its builtin kernels, XNNPACK off: TFLite's integer arithmetic, which TFLM implements.

    XNNPACK (LiteRT's default, TFLitePolicy's) requantizes int8 in float and can round an action
    gap the other way, so on int8 policies TFLM is compared with this; on fp32 with TFLitePolicy.
    """

    def __init__(self, path: Path) -> None:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        interp = Interpreter(model_path=str(path),
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        self._runner = interp.get_signature_runner("serving_default")
        self._dtype = interp.get_input_details()[0]["dtype"]  # float32, or uint8 for a raw observation

    def actions(self, obs: np.ndarray) -> np.ndarray:
        return self._runner(observations=np.asarray(obs, self._dtype))["action"]

    def act(self, obs: np.ndarray) -> int:
        return int(self.actions(np.asarray(obs)[None])[0])


@needs_tflm
def test_micro_policy_plays_like_litert(policies):
    from compress_dqn.evaluation.play import evaluate
    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.recipe.schema import EnvConfig

    env = EnvConfig(id="CartPole-v1")
    obs = np.random.default_rng(1).normal(0, 1, size=(2000, 4)).astype(np.float32)
    for kind in ("int8", "qat", "qat-fhead", "fp32"):
        lite, tflm = TFLitePolicy(policies[kind]), micro.MicroPolicy(policies[kind])
        reference = lite if kind == "fp32" else LiteRTBuiltin(policies[kind])
        assert (tflm.obs_shape, tflm.n_actions) == (lite.obs_shape, lite.n_actions) == ((4,), 2)
        actions = reference.actions(obs)
        assert len(set(actions.tolist())) == 2, kind  # not trivially one action
        np.testing.assert_array_equal(tflm.actions(obs), actions, err_msg=kind)
        assert [tflm.act(o) for o in obs[:100]] == actions[:100].tolist()
        # Dequantized q-values: int8 kernels may round an output step apart from XNNPACK's.
        # The float heads' q-values: one int8 step of the body's last features apart at most.
        step = (0.0 if kind == "fp32" else 0.05 if kind == "qat-fhead"
                else micro.MicroPolicy(micro.int8_io_model(policies[kind].read_bytes())).q_quantization[0])
        np.testing.assert_allclose(tflm.q_values(obs), lite.q_values(obs), atol=2 * step + 1e-5, err_msg=kind)
        assert evaluate(tflm.act, env, 10, 0).episodes == evaluate(reference.act, env, 10, 0).episodes, kind


@needs_tflm
def test_cli_evaluate_runtime_micro_matches_litert_without_tensorflow(policies):
    from compress_dqn.evaluation.play import evaluate
    from compress_dqn.recipe.schema import EnvConfig

    runs = {}
    for kind, runtime in (("fp32", "litert"), ("fp32", "micro"), ("int8", "micro")):
        code, out, err = _cli("evaluate", str(policies[kind]), "--env", "CartPole-v1", "--episodes", "3", "--runtime", runtime)
        assert code == 0, err
        runs[kind, runtime] = json.loads(out)
        assert runs[kind, runtime]["runtime"] == runtime
    assert runs["fp32", "micro"]["return"]["episodes"] == runs["fp32", "litert"]["return"]["episodes"]
    builtin = evaluate(LiteRTBuiltin(policies["int8"]).act, EnvConfig(id="CartPole-v1"), 3, 0).episodes
    assert runs["int8", "micro"]["return"]["episodes"] == builtin
    code = (
        "import sys, numpy as np\n"
        "from compress_dqn.deploy.micro import MicroPolicy\n"
        "MicroPolicy(sys.argv[1]).act(np.zeros(4, np.float32))\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(policies["int8"])], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_tflm
def test_int8_io_rewrites_a_qat_split_head_without_changing_actions(policies, tmp_path):
    from compress_dqn.deploy.litert.policy import TFLitePolicy

    code, stdout, err = _cli("export", str(policies["qat"]), "--out", str(tmp_path / "q"), "--int8-io")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["ops"] == ["FULLY_CONNECTED", "ARG_MAX", "ADD"]  # the float ADD of the heads is int8 now
    assert report["int8_io"]["rewritten"] and report["q_values"]["dtype"] == "int8"
    assert report["int8_io"]["q_values_max_change"] <= report["q_values"]["scale"] / 2 + 1e-6
    assert report["arena_bytes"] < micro.micro_summary(policies["qat"]).arena_bytes
    deployed = tmp_path / "q" / f"{report['name']}.tflite"
    obs = np.random.default_rng(4).normal(0, 1, size=(1000, 4)).astype(np.float32)
    expected = micro.MicroPolicy(policies["qat"]).actions(obs)
    np.testing.assert_array_equal(micro.MicroPolicy(deployed).actions(obs), expected)
    assert TFLitePolicy(deployed).input_dtype == np.int8


@needs_tflm
def test_export_int8_io_writes_files_that_compile(policies, tmp_path):
    from compress_dqn.deploy.litert.policy import TFLitePolicy

    out = tmp_path / "out"
    code, stdout, err = _cli("export", str(policies["int8"]), "--target", "micro", "--out", str(out), "--int8-io",
                             "--name", "cart-pole")
    assert code == 0, err
    report = json.loads(stdout)
    name = report["name"]
    assert name == "cart_pole"
    assert sorted(p.name for p in out.iterdir()) == sorted(report["files"])
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    deployed = out / f"{name}.tflite"
    assert report["flash_bytes"] == deployed.stat().st_size and report["arena_bytes"] > 0
    assert report["ops"] == ["FULLY_CONNECTED", "ARG_MAX", "ADD"]  # QUANTIZE/DEQUANTIZE gone: no float on the device
    assert report["input"]["dtype"] == "int8" and report["q_values"]["dtype"] == "int8"
    assert not report["compression"]["applied"] and "255" in report["compression"]["reason"]
    header = (out / f"{name}_model.h").read_text()
    assert f"constexpr unsigned int model_len = {report['flash_bytes']};" in header
    assert f"constexpr unsigned int arena_size = {report['arena_bytes_with_margin']};" in header
    assert f"constexpr int input_zero_point = {report['input']['zero_point']};" in header
    assert "constexpr float q_values_scale" in header
    example = (out / f"{name}_example.cc").read_text()
    assert "tflite::MicroMutableOpResolver<3> resolver;" in example
    assert all(f"resolver.{m}()" in example for m in ("AddFullyConnected", "AddArgMax", "AddAdd"))
    assert "const int8_t* observation" in example and str(report["arena_bytes"]) in (out / "README.md").read_text()
    # The rewritten model is the same policy with int8 io, for LiteRT and TFLM alike.
    original, rewritten = TFLitePolicy(policies["int8"]), TFLitePolicy(deployed)
    assert rewritten.input_dtype == np.int8
    obs = np.random.default_rng(2).normal(0, 1, size=(500, 4)).astype(np.float32)
    np.testing.assert_array_equal(rewritten.actions(obs), original.actions(obs))
    np.testing.assert_array_equal(micro.MicroPolicy(deployed).actions(obs), original.actions(obs))

    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler (g++) to compile the generated model files")
    (tmp_path / "main.cc").write_text(
        f'#include <cstdint>\n#include <cstdio>\n#include "{name}_model.h"\n'
        "int main() {\n"
        f"  if (reinterpret_cast<std::uintptr_t>({name}::model) % 16 != 0) return 3;\n"
        f"  std::fwrite({name}::model, 1, {name}::model_len, stdout);\n"
        f"  return {name}::input_size == 4 && {name}::num_actions == 2 ? 0 : 4;\n"
        "}\n"
    )
    binary = tmp_path / "dump"
    build = subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{out}", str(tmp_path / "main.cc"),
                            str(out / f"{name}_model.cc"), "-o", str(binary)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    dumped = subprocess.run([str(binary)], capture_output=True)
    assert dumped.returncode == 0
    assert dumped.stdout == deployed.read_bytes()


@needs_tflm
def test_int8_io_refused_for_a_float_policy(policies, tmp_path):
    code, _, err = _cli("export", str(policies["fp32"]), "--out", str(tmp_path / "o"), "--int8-io")
    assert code == 2 and err.count("\n") == 1 and "full-integer" in err and "int8" in err
    assert not (tmp_path / "o").exists()


@needs_tflm
def test_unsupported_op_and_bad_files_get_one_line(policies, tmp_path):
    code, _, err = _cli("export", str(policies["prod"]), "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1 and "op REDUCE_PROD" in err
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes(policies["int8"].read_bytes()[:300])
    for path, words in [(junk, "not a TFLite flatbuffer"), (truncated, "truncated or damaged"),
                        (tmp_path / "missing.tflite", "no such file"), (tmp_path, "is a directory")]:
        for args in (["export", str(path), "--out", str(tmp_path / "o")],
                     ["evaluate", str(path), "--env", "CartPole-v1", "--runtime", "micro"]):
            code, _, err = _cli(*args)
            assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, (args, err)


@needs_tflm
def test_a_normalization_that_does_not_fit_the_input_is_refused(policies):
    """MicroPolicy normalized an 8-feature observation with a 4-feature mean, reshaped, and played on."""
    from compress_dqn.deploy.tflite.metadata import with_input_normalization
    from compress_dqn.envs.normalization import Normalization

    bad = with_input_normalization(policies["fp32"].read_bytes(), Normalization(np.zeros(2), np.ones(2)))
    with pytest.raises(UserError, match="2 features but its input has 4"):
        micro.MicroPolicy(bad)


def test_damaged_models_are_refused_not_crashed(policies):
    """TFLM follows the flatbuffer's offsets unchecked; flipped bytes must give an error, not a segfault."""
    code = (
        "import sys, numpy as np\n"
        "from compress_dqn.deploy import micro\n"
        "from compress_dqn.errors import UserError\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "rng = np.random.default_rng(0)\n"
        "for _ in range(40):\n"
        "    bad = bytearray(data)\n"
        "    for i in rng.integers(8, len(bad), size=3):\n"
        "        bad[i] = int(rng.integers(0, 256))\n"
        "    try:\n"
        "        micro.MicroPolicy(bytes(bad)).act(np.zeros(4, np.float32))\n"
        "    except UserError:\n"
        "        pass\n"
        "print('survived')\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(policies["int8"])], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "survived" in result.stdout, result.stderr[-2000:]


@needs_tflm
def test_tflm_compression_kept_only_when_smaller_and_identical(policies, tmp_path):
    int8 = micro.try_compression(policies["int8"].read_bytes())
    assert int8.data is None and "255" in int8.reason
    original = policies["clustered"].read_bytes()
    packed = micro.try_compression(original)
    assert packed.data is not None and len(packed.data) < len(original) / 2
    assert packed.arena_bytes > micro.micro_summary(original).arena_bytes  # decoded weights live in RAM
    obs = np.random.default_rng(3).normal(0, 2, size=(300, 4)).astype(np.float32)
    np.testing.assert_array_equal(micro.MicroPolicy(packed.data).q_values(obs), micro.MicroPolicy(original).q_values(obs))
    code, stdout, err = _cli("export", str(policies["clustered"]), "--out", str(tmp_path / "c"), "--compress")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["compression"]["applied"] and report["flash_bytes"] == len(packed.data)
    assert "TFLM_DECODE" in report["ops"]
    assert "resolver.AddDecode()" in (tmp_path / "c" / f"{report['name']}_example.cc").read_text()
    # LiteRT has no TFLM_DECODE kernel: one line naming the runtime to use, not a traceback
    code, _, err = _cli("evaluate", str(tmp_path / "c" / f"{report['name']}.tflite"), "--env", "CartPole-v1", "--episodes", "1")
    assert code == 2 and "cannot prepare it" in err and "--runtime micro" in err and "Traceback" not in err


def test_without_tflite_micro_the_command_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tflite_micro", None)  # import fails as if not installed
    policy = tmp_path / "policy.tflite"
    policy.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    assert not micro.available()
    for args in (["export", str(policy)], ["evaluate", str(policy), "--env", "CartPole-v1", "--runtime", "micro"]):
        code, _, err = _cli(*args)
        assert code == 2 and err.count("\n") == 1 and "pip install 'compress-dqn[micro]'" in err, err
    assert micro.micro_summary(policy).reason.endswith("pip install 'compress-dqn[micro]'")


NORMALIZED_SCALES = np.array([2.0, 1.0, 0.05, 0.5], np.float32)


@needs_tflm
def test_a_normalized_policy_runs_on_tflm_from_raw_observations_and_its_int8_io_export_says_how(policies, tmp_path):
    """On TFLM the file normalizes raw observations itself (SUB, DIV); with --int8-io those ops go and
    the header, example and README give the caller the mean, std, scale and zero point."""
    raw = (np.random.default_rng(6).normal(0, 1, size=(1000, 4)) * NORMALIZED_SCALES).astype(np.float32)
    summary = micro.micro_summary(policies["normalized"])
    assert summary.ops[:3] == ["SUB", "DIV", "QUANTIZE"]
    expected = LiteRTBuiltin(policies["normalized"]).actions(raw)
    assert len(set(expected.tolist())) == 2
    np.testing.assert_array_equal(micro.MicroPolicy(policies["normalized"]).actions(raw), expected)
    out = tmp_path / "n"
    code, stdout, err = _cli("export", str(policies["normalized"]), "--out", str(out), "--int8-io", "--name", "n")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["ops"] == ["FULLY_CONNECTED", "ARG_MAX", "ADD"] and report["input"]["dtype"] == "int8"
    deployed = micro.MicroPolicy(out / "n.tflite")
    np.testing.assert_allclose(deployed.input_normalization.std, [2.0, 1.0, 0.05, 0.5])
    np.testing.assert_array_equal(deployed.actions(raw), expected)
    header, example = (out / "n_model.h").read_text(), (out / "n_example.cc").read_text()
    assert "constexpr float input_mean[4]" in header and "constexpr float input_std[4]" in header
    assert "n_quantize(raw, observation);" in example and "the caller normalizes" in (out / "README.md").read_text()
    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler (g++) to compile the generated quantize helper")
    # The example's n_quantize() gives the int8 input MicroPolicy feeds TFLM for the same raw observations.
    helper = example[example.index("void n_quantize("):example.index("#ifndef N_NO_MAIN")]
    (tmp_path / "q.cc").write_text(
        '#include <cmath>\n#include <cstdint>\n#include <cstdio>\n#include "n_model.h"\n' + helper +
        "int main() {\n  float raw[4];\n  int8_t q[4];\n"
        "  while (std::scanf(\"%f %f %f %f\", &raw[0], &raw[1], &raw[2], &raw[3]) == 4) {\n"
        "    n_quantize(raw, q);\n    std::printf(\"%d %d %d %d\\n\", q[0], q[1], q[2], q[3]);\n  }\n}\n")
    build = subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", f"-I{out}", str(tmp_path / "q.cc"), "-o",
                            str(tmp_path / "q")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    text = "\n".join(" ".join(f"{v:.9g}" for v in row) for row in raw[:300])
    done = subprocess.run([str(tmp_path / "q")], input=text, capture_output=True, text=True)
    got = np.array([[int(v) for v in line.split()] for line in done.stdout.splitlines()])
    np.testing.assert_array_equal(got, np.stack([deployed._prepare(o).reshape(4) for o in raw[:300]]))


@needs_tflm
def test_the_summary_states_tflm_s_own_flash_and_what_fits_counts(policies):
    summary = micro.micro_summary(policies["int8"])
    estimate = summary.runtime_flash_estimate
    assert estimate.low_bytes == 9732 and estimate.high_bytes == 22 * 1024 and "memory_footprint" in estimate.source
    assert summary.fits_flash == {budget: summary.flash_bytes + 22 * 1024 <= size
                                     for budget, size in micro.RAM_BUDGETS.items()}
    assert "RAM" in summary.fits_counts and "flash" in summary.fits_counts
    assert micro.flash_fits(10 * 1024) == {"32KB": True, "256KB": True}
    assert micro.flash_fits(11 * 1024) == {"32KB": False, "256KB": True}  # 11 KB + 22 KB of runtime > 32 KB


def _uint8_cnn(path: Path, quantize: str | None) -> Path:
    """A MinAtar-shaped (10x10x4 uint8) conv policy, int8 (CAST, QUANTIZE first) or float (CAST first)."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import converter_setup
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.deploy.tflite.outputs import with_float_q_values
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig

    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((10, 10, 4)), tf_keras.layers.Conv2D(4, 3, activation="relu", name="conv_0"),
                                 tf_keras.layers.Flatten(name="flatten"), tf_keras.layers.Dense(16, activation="relu", name="hidden_0"),
                                 tf_keras.layers.Dense(3, name="q_values")])
    saved = export_saved_model(split_value_advantage(model), (10, 10, 4), np.uint8, path.with_suffix(".sm"))
    calibration = np.random.default_rng(0).integers(0, 2, (64, 10, 10, 4)).astype(np.uint8)
    configure = converter_setup(QuantizeConfig(mode=quantize), calibration) if quantize else None
    data = convert_tflite(saved, configure)
    path.write_bytes(with_float_q_values(data) if quantize else data)
    return path


@needs_tflm
@pytest.mark.parametrize("quantize", ["int8", None])
def test_a_uint8_observation_policy_exports_for_tflm_and_plays_as_the_reference_kernels(quantize, tmp_path):
    """TFLM's CAST takes no uint8: the export makes CAST + QUANTIZE one QUANTIZE uint8 -> int8, a lone CAST a
    DEQUANTIZE (scale 1, zero point 0); the model still takes the raw observation."""
    from compress_dqn.deploy.micro.model import inspect_model
    from compress_dqn.deploy.litert.policy import TFLitePolicy

    path = _uint8_cnn(tmp_path / "cnn.tflite", quantize)
    assert inspect_model(path.read_bytes()).ops[0] == "CAST"
    export = micro_export(path, tmp_path / "out", ExportOptions(name="cnn"))
    assert export.runs and export.arena_bytes > 0 and export.input.dtype == "uint8"
    assert "CAST" not in export.ops and export.ops[0] == ("QUANTIZE" if quantize else "DEQUANTIZE")
    assert inspect_model(path.read_bytes()).ops[0] == "CAST"  # the shipped file stays as it is
    deployed = (tmp_path / "out" / "cnn.tflite").read_bytes()
    assert "Pass the raw uint8 observation unchanged" in (tmp_path / "out" / "cnn_model.h").read_text()

    states = np.random.default_rng(1).integers(0, 2, (2000, 10, 10, 4)).astype(np.uint8)
    reference = TFLitePolicy(path, reference_kernels=True).actions(states)
    assert len(set(reference.tolist())) > 1  # a policy that takes one action everywhere would prove nothing
    # The rewrite itself computes the same: LiteRT's reference kernels play the deployed bytes as the original.
    np.testing.assert_array_equal(TFLitePolicy(deployed, reference_kernels=True).actions(states), reference)
    tflm = micro.MicroPolicy(deployed).actions(states)
    np.testing.assert_array_equal(tflm, reference)
    if quantize:  # TFLM's integer kernels are LiteRT's builtin ones (the reference FC rounds in double, rarely apart)
        np.testing.assert_array_equal(tflm, LiteRTBuiltin(path).actions(states))
    np.testing.assert_array_equal(micro.MicroPolicy(path).actions(states[:200]), tflm[:200])  # rewritten on load too

    summary = micro.micro_summary(path)
    assert summary.runs and summary.reason is None and summary.arena_bytes == export.arena_bytes
    assert summary.ops == export.ops and summary.flash_bytes == len(deployed)
