"""Input normalization of integer policies: inside the .tflite's graph (any runtime plays it on raw
observations), metadata only for an int8 input's caller, and why it exists (one int8 input scale for
features of very different ranges loses the small ones)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from compress_dqn.compress.quantize import converter_setup
from compress_dqn.errors import UserError
from compress_dqn.convert.conversion import convert_tflite, export_saved_model
from compress_dqn.compress.rewrites import input_statistics, normalize_model_input, split_value_advantage
from compress_dqn.rl.networks import build_q_network
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.envs.normalization import Normalization
from compress_dqn.recipe.schema import QuantizeConfig
from compress_dqn.deploy.tflite.graph_input import carry_input_normalization, graph_normalization
from compress_dqn.deploy.tflite.metadata import (
    INPUT_NORMALIZATION, add_metadata, input_normalization, read_metadata, with_input_normalization,
)

SCALES = np.array([2.0, 2.0, 0.02, 0.05], np.float32)  # CartPole-like: small angle features matter most


def sensitive_model():
    """A network whose actions hinge on every feature in its own units (the small ones included),
    as a trained CartPole policy's hinge on the pole angle: fitted to Q = [0, w . (obs / SCALES)]."""
    from compress_dqn._tf import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = build_q_network((4,), 2, [32, 32])
    x = observations(4000, 0)
    target = np.stack([np.zeros(len(x)), (x / SCALES) @ np.array([0.5, -0.3, 1.0, 0.8])], axis=1).astype(np.float32)
    model.compile(optimizer=tf_keras.optimizers.Adam(3e-3), loss="mse")
    model.fit(x, target, epochs=40, batch_size=64, verbose=0)
    return split_value_advantage(model)


def observations(n, seed):
    return (np.random.default_rng(seed).normal(size=(n, 4)) * SCALES).astype(np.float32)


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """fp32, plain int8 and normalized int8 TFLite files of one model, the latter's graph before its
    normalization went in, and that normalization."""
    out = tmp_path_factory.mktemp("meta")
    model, calibration = sensitive_model(), observations(500, 1)
    export_saved_model(model, (4,), np.float32, out / "raw")
    fp32 = convert_tflite(out / "raw")
    int8 = convert_tflite(out / "raw", converter_setup(QuantizeConfig(mode="int8"), calibration))
    norm = input_statistics(calibration)
    export_saved_model(normalize_model_input(model, norm), (4,), np.float32, out / "normalized")
    normalized = convert_tflite(out / "normalized", converter_setup(QuantizeConfig(mode="int8"), norm.apply(calibration)))
    int8_io = convert_tflite(out / "normalized", converter_setup(QuantizeConfig(mode="int8", int8_io=True), norm.apply(calibration)))
    return fp32, int8, carry_input_normalization(normalized, norm), norm, normalized, int8_io


def test_metadata_round_trip_keeps_the_model_runnable(policies):
    fp32 = policies[0]
    assert read_metadata(fp32, "x") is None and input_normalization(fp32) is None
    tagged = add_metadata(fp32, "x", b"hello")
    assert read_metadata(add_metadata(tagged, "x", b"again"), "x") == b"again"  # replaced, not duplicated
    obs = observations(100, 2)
    np.testing.assert_array_equal(TFLitePolicy(tagged).q_values(obs), TFLitePolicy(fp32).q_values(obs))


def test_normalized_int8_keeps_the_actions_plain_int8_loses(policies):
    fp32, int8, normalized, norm, _, _ = policies
    held_out = observations(2000, 3)  # not the calibration states
    reference = TFLitePolicy(fp32).actions(held_out)
    plain = TFLitePolicy(int8)
    policy = TFLitePolicy(normalized)
    np.testing.assert_allclose(graph_normalization(normalized).mean, norm.mean)
    assert policy.input_normalization is None and INPUT_NORMALIZATION.encode() not in normalized  # in the graph
    plain_agreement = np.mean(plain.actions(held_out) == reference)
    agreement = np.mean(policy.actions(held_out) == reference)
    assert 0.2 < np.mean(reference) < 0.8  # both actions occur
    assert agreement >= 0.95 > plain_agreement + 0.05
    assert [policy.act(o) for o in held_out[:200]] == policy.actions(held_out[:200]).tolist()


def test_a_normalization_that_does_not_fit_the_input_is_refused(policies):
    fp32 = policies[0]
    bad = with_input_normalization(fp32, Normalization(np.zeros(3), np.ones(3)))
    with pytest.raises(UserError, match="3 features"):
        TFLitePolicy(bad)
    with pytest.raises(UserError, match="unreadable"):
        TFLitePolicy(add_metadata(fp32, "compress_dqn.input_normalization", b"{not json"))
    for mean, std in [([float("nan"), 0, 0, 0], [1, 1, 1, 1]), ([0, 0, 0, 0], [1, float("inf"), 1, 1])]:
        with pytest.raises(UserError, match="unreadable"):  # a NaN mean played every action on NaN inputs
            TFLitePolicy(with_input_normalization(fp32, Normalization(np.array(mean), np.array(std))))


def test_normalization_metadata_is_exact_and_short(policies):
    """The loader reads back exactly the float32 statistics written, at float32's shortest decimals."""
    fp32 = policies[0]
    rng = np.random.default_rng(7)
    mean = (rng.normal(0, 1, 8) * np.logspace(-7, 5, 8)).astype(np.float32)
    std = (rng.uniform(0.5, 2, 8) * np.logspace(-6, 4, 8)).astype(np.float32)
    tagged = with_input_normalization(fp32, Normalization(mean, std))
    got = input_normalization(tagged)
    np.testing.assert_array_equal(got.mean, mean)
    np.testing.assert_array_equal(got.std, std)
    assert len(read_metadata(tagged, "compress_dqn.input_normalization")) < 16 * 16  # <= ~16 chars per number


@pytest.mark.parametrize("mode", [None, "dynamic", "int8", "int16x8", "sparse"])
def test_slim_tensor_names_keep_the_computation(tmp_path, mode):
    """Inner tensors lose their fused-op names, the file shrinks, and every output is bit-equal."""
    import gzip

    from compress_dqn._tf import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = split_value_advantage(build_q_network((4,), 2, [32, 32]))
    if mode == "sparse":  # 90% zeros in the 32x32 layer, for TFLite's sparse weight format
        kernel, bias = model.get_layer("hidden_1").get_weights()
        kernel[np.random.default_rng(0).random(kernel.shape) < 0.9] = 0.0
        model.get_layer("hidden_1").set_weights([kernel, bias])
    export_saved_model(model, (4,), np.float32, tmp_path / "sm")
    calibration = observations(200, 1)
    quantize = None if mode in (None, "sparse") else QuantizeConfig(mode=mode)
    configure = None if mode is None else converter_setup(quantize, calibration, sparse=mode == "sparse")
    full = convert_tflite(tmp_path / "sm", configure, slim_names=False)
    slim = convert_tflite(tmp_path / "sm", configure)
    assert len(slim) < len(full) and len(gzip.compress(slim)) < len(gzip.compress(full))
    obs = observations(300, 2)
    np.testing.assert_array_equal(TFLitePolicy(slim).q_values(obs), TFLitePolicy(full).q_values(obs))
    from ai_edge_litert import schema_py_generated as schema

    graph = schema.ModelT.InitFromPackedBuf(bytearray(slim), 0).subgraphs[0]
    inner = [t.name.decode() for i, t in enumerate(graph.tensors) if i not in set(graph.inputs) | set(graph.outputs)]
    assert inner and all(name == f"t{i}" for name, i in zip(inner, [i for i in range(len(graph.tensors))
                                                                     if i not in set(graph.inputs) | set(graph.outputs)]))


def _plain(data: bytes, obs: np.ndarray, reference_kernels: bool) -> np.ndarray:
    """Actions from LiteRT's Interpreter alone, as anyone's code would get them (no compress-dqn loader)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.AUTO
    runner = Interpreter(model_content=data, experimental_op_resolver_type=kind).get_signature_runner("serving_default")
    return np.concatenate([runner(observations=row[None])["action"] for row in obs])


def test_a_normalized_policy_plays_raw_observations_in_plain_litert_and_tflm(policies):
    """The normalization ops compute what the loader did in numpy, bit for bit: same actions on raw
    observations as the graph without them on (obs - mean) / std, with reference and XNNPACK kernels."""
    from compress_dqn.deploy import micro

    _, _, normalized, norm, before, _ = policies
    raw = observations(1000, 4)
    for reference in (True, False):
        np.testing.assert_array_equal(_plain(normalized, raw, reference), _plain(before, norm.apply(raw), reference))
    assert 0.2 < np.mean(_plain(normalized, raw, True)) < 0.8
    if micro.available():
        np.testing.assert_array_equal(micro.MicroPolicy(normalized).actions(raw), _plain(normalized, raw, True))


def test_an_int8_input_keeps_its_normalization_as_metadata_for_its_caller(policies):
    """An int8 input is quantized by its caller, so the caller normalizes: the loader does it for it."""
    _, _, _, norm, _, int8_io = policies
    carried = carry_input_normalization(int8_io, norm)
    assert graph_normalization(carried) is None and input_normalization(carried) is not None
    policy = TFLitePolicy(carried)
    held_out = observations(1000, 3)
    assert policy.input_dtype == np.int8
    assert np.mean(policy.actions(held_out) == TFLitePolicy(policies[0]).actions(held_out)) >= 0.95


def test_an_older_file_needing_its_loader_is_refused_and_export_tflite_makes_it_self_contained(policies, tmp_path):
    from compress_dqn.cli import main
    from click.testing import CliRunner

    _, _, _, norm, before, _ = policies
    legacy = tmp_path / "legacy.tflite"
    legacy.write_bytes(with_input_normalization(before, norm))  # how exports carried it until now
    with pytest.raises(UserError, match="--target tflite"):
        TFLitePolicy(legacy)
    out = tmp_path / "ship" / "policy.tflite"
    (tmp_path / "ship").mkdir()
    result = CliRunner().invoke(main, ["export", str(legacy), "--target", "tflite", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rewrote_metadata_normalization"] and report["input"] == {"dtype": "float32", "shape": [4], "caller_normalizes": False}
    raw = observations(500, 5)
    shipped = out.read_bytes()
    assert INPUT_NORMALIZATION.encode() not in shipped
    np.testing.assert_array_equal(_plain(shipped, raw, False), _plain(before, norm.apply(raw), False))
    # The usage snippet runs as written, with LiteRT and numpy alone, on raw observations.
    usage = (tmp_path / "ship" / "policy.usage.md").read_text()
    snippet = usage.split("```python\n")[1].split("```")[0]
    check = snippet + "import sys, json\nprint(json.dumps([act(o) for o in json.loads(sys.stdin.read())]))\n"
    done = subprocess.run([sys.executable, "-c", check], cwd=out.parent, input=json.dumps(raw.tolist()),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == _plain(shipped, raw, False).tolist()
