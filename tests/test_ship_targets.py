"""The runtime-free targets, checked by playing: the generated C (compiled with the system's C compiler)
takes LiteRT's reference-kernel action on every state of every episode; the ONNX export, played by an
outsider with onnxruntime alone, gets evaluate's returns; and every file's q_values argmax is its action."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.deploy.litert.policy import TFLitePolicy

HERE = Path(__file__).resolve().parent
EPISODES = 3


@pytest.fixture(scope="module")
def tiny_run(tiny_variants_run):
    return tiny_variants_run  # conftest's, shared with test_outsider: five variants and the baseline


def _policies(run: Path) -> dict[str, Path]:
    found = {p.parent.name: p for p in sorted(run.glob("*/**/policy.tflite"))}
    assert {"ptq-int8", "qat-int8", "student-qat", "ptq-dynamic", "ptq-float16", "baseline"} <= set(found), found
    return found


def _play_side_by_side(c_act, ref_act, env_id: str, seeds, states: np.ndarray) -> tuple[int, int]:
    """(steps where the C action differs from the reference's, steps played) over episodes and extra states."""
    from compress_dqn.envs.episodes import run_episodes
    from compress_dqn.recipe.schema import EnvConfig

    counts = [0, 0]

    def act(obs):
        ours, theirs = c_act(obs), ref_act(obs)
        counts[0] += ours != theirs
        counts[1] += 1
        return theirs

    run_episodes(act, EnvConfig(id=env_id), seeds)
    for obs in states:
        act(obs)
    return counts[0], counts[1]


@pytest.mark.slow
def test_the_c_policy_takes_the_reference_kernels_action_on_every_state(tiny_run, tmp_path):
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared

    states = np.random.default_rng(0).normal(0, 1.5, (500, 4)).astype(np.float32)
    checked = []
    for name, path in _policies(tiny_run).items():
        policy = generate_c(path, f"{name}_p")
        folder = tmp_path / name
        folder.mkdir()
        act = c_actor(compile_shared(policy, folder), policy)
        differ, steps = _play_side_by_side(act, TFLitePolicy(path, reference_kernels=True).act, "CartPole-v1", range(EPISODES), states)
        assert differ == 0 and steps > len(states), (name, differ, steps)
        assert policy.integer == (name in ("ptq-int8", "qat-int8", "student-qat")), name
        if policy.integer:  # integer-only after the input's quantization: no float in the layers
            body = policy.source.split(f"int {policy.name}_act(")[1]
            assert "fc_f32" not in body and "conv_f32" not in body
        checked.append(name)
    assert len(checked) == 6


def _cnn_student(folder: Path, int8: bool = True) -> Path:
    """A MinAtar-shaped (10x10x4 uint8) conv student: one 3x3 conv, 16 hidden, split heads, full int8 (or float)."""
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
    if not int8:  # biases as training leaves them, not Keras' zeros, so the C must add them
        for layer in model.layers[::2]:
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, np.random.default_rng(3).normal(0, 0.3, bias.shape).astype(np.float32)])
    saved = export_saved_model(split_value_advantage(model), (10, 10, 4), np.uint8, folder / "saved_model")
    calibration = np.random.default_rng(0).integers(0, 2, (64, 10, 10, 4)).astype(np.uint8)
    data = (with_float_q_values(convert_tflite(saved, converter_setup(QuantizeConfig(mode="int8"), calibration)))
            if int8 else convert_tflite(saved))
    path = folder / ("cnn.tflite" if int8 else "cnn_f32.tflite")
    path.write_bytes(data)
    return path


@pytest.mark.slow
def test_a_cnn_student_in_c_plays_as_the_reference_kernels(tmp_path):
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    path = _cnn_student(tmp_path)
    assert {op.kind for op in read_policy_graph(path).ops} >= {"CONV_2D", "FULLY_CONNECTED", "RESHAPE", "ARG_MAX"}
    policy = generate_c(path, "cnn")
    assert policy.integer and policy.obs_type == "uint8_t" and "int cnn_act(const uint8_t *observation);" in policy.header
    act = c_actor(compile_shared(policy, tmp_path), policy)
    states = np.random.default_rng(1).integers(0, 2, (1000, 10, 10, 4)).astype(np.uint8)
    differ, steps = _play_side_by_side(act, TFLitePolicy(path, reference_kernels=True).act, "MinAtar/Breakout-v1", range(2), states)
    assert differ == 0 and steps > len(states)
    assert len({act(s) for s in states[:200]}) > 1  # a policy that takes one action everywhere would prove nothing


def test_a_float_cnn_in_c_plays_as_the_reference_kernels(tmp_path):
    """conv_f32 (a float CNN, the MinAtar baselines' form) sums as the reference kernel does."""
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared

    path = _cnn_student(tmp_path, int8=False)
    policy = generate_c(path, "cnn_f32")
    assert not policy.integer and "conv_f32" in policy.source
    act = c_actor(compile_shared(policy, tmp_path), policy)
    states = np.random.default_rng(2).integers(0, 2, (1000, 10, 10, 4)).astype(np.uint8)
    reference = TFLitePolicy(path, reference_kernels=True)
    assert [act(s) for s in states] == [reference.act(s) for s in states]
    assert len({act(s) for s in states[:200]}) > 1


@pytest.mark.slow
def test_a_float_head_qat_student_in_c_plays_as_the_reference_kernels(tmp_path):
    """quantize.float_head: int8 conv and hidden layer, then float advantage and value heads."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import FLOAT_HEADS, calibrate_ranges, converter_setup, qat_model
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared
    from compress_dqn.deploy.tflite.outputs import with_float_q_values
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig

    tf_keras.utils.set_random_seed(0)
    model = split_value_advantage(tf_keras.Sequential([
        tf_keras.Input((10, 10, 4)), tf_keras.layers.Rescaling(1 / 255, name="rescale"),
        tf_keras.layers.Conv2D(4, 3, activation="relu", name="conv_0"), tf_keras.layers.Flatten(name="flatten"),
        tf_keras.layers.Dense(16, activation="relu", name="hidden_0"), tf_keras.layers.Dense(3, name="q_values")]))
    states = np.random.default_rng(1).integers(0, 2, (1000, 10, 10, 4)).astype(np.uint8) * 255
    qat = qat_model(model, float_layers=FLOAT_HEADS)
    calibrate_ranges(qat, model, states[:256].astype(np.float32))
    saved = export_saved_model(qat, (10, 10, 4), np.uint8, tmp_path / "saved_model")
    path = tmp_path / "fhead.tflite"
    path.write_bytes(with_float_q_values(convert_tflite(saved, converter_setup(QuantizeConfig(mode="qat", float_head=True)))))
    policy = generate_c(path, "fhead")
    assert not policy.integer  # the heads compute in float
    act = c_actor(compile_shared(policy, tmp_path), policy)
    reference = TFLitePolicy(path, reference_kernels=True)
    assert [act(s) for s in states] == reference.actions(states).tolist()
    assert len({act(s) for s in states[:200]}) > 1  # a policy that takes one action everywhere would prove nothing


@pytest.mark.slow
def test_a_low_bit_kernel_student_in_c_and_onnx_plays_as_the_reference_kernels(tmp_path):
    """quantize.kernel_bits: the hidden layer's INT4 kernel (two weights a byte, a scale per unit)
    read as int8 by the exporters (the C packs it two a byte again): C and ONNX take LiteRT's reference-kernel action on every state,
    and TensorFlow Lite Micro exports and plays it."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import FLOAT_HEADS, calibrate_ranges, converter_setup, qat_model
    from compress_dqn.compress.rewrites import flattened_dense_as_conv, split_value_advantage
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared
    from compress_dqn.deploy.tflite.outputs import with_float_q_values
    from compress_dqn.deploy.tflite.graph import read_policy_graph
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig

    tf_keras.utils.set_random_seed(0)
    model = flattened_dense_as_conv(split_value_advantage(tf_keras.Sequential([
        tf_keras.Input((10, 10, 4)), tf_keras.layers.Rescaling(1 / 255, name="rescale"),
        tf_keras.layers.Conv2D(4, 3, activation="relu", name="conv_0"), tf_keras.layers.Flatten(name="flatten"),
        tf_keras.layers.Dense(16, activation="relu", name="hidden_0"), tf_keras.layers.Dense(3, name="q_values")])))
    states = np.random.default_rng(1).integers(0, 2, (1000, 10, 10, 4)).astype(np.uint8) * 255
    qat = qat_model(model, float_layers=FLOAT_HEADS, kernel_bits={"hidden_0": 3})
    calibrate_ranges(qat, model, states[:256].astype(np.float32))
    saved = export_saved_model(qat, (10, 10, 4), np.uint8, tmp_path / "saved_model")
    path = tmp_path / "low_bit.tflite"
    path.write_bytes(with_float_q_values(convert_tflite(saved, converter_setup(QuantizeConfig(mode="qat", float_head=True)))))
    kernel = next(t for op in read_policy_graph(path).ops for t in op.inputs
                  if t is not None and t.value is not None and t.shape == (16, 8, 8, 4))
    assert kernel.dtype == np.int8 and set(np.unique(kernel.value)) == set(range(-3, 4)) and kernel.scales.size == 16
    reference = TFLitePolicy(path, reference_kernels=True).actions(states).tolist()
    assert len(set(reference[:200])) > 1  # a policy that takes one action everywhere would prove nothing
    policy = generate_c(path, "low_bit")
    assert policy.form == "packed" and "int4_dot" in policy.source  # two a byte in the C too (deploy/c/packed.py)
    act = c_actor(compile_shared(policy, tmp_path), policy)
    assert [act(s) for s in states] == reference
    dense = generate_c(path, "low_bit_dense", compress=False)  # a byte a weight, as before: the same actions
    act_dense = c_actor(compile_shared(dense, tmp_path), dense)  # compiled once, not once a state (0.2 s of gcc each)
    assert [act_dense(s) for s in states] == reference
    for session in _onnx_sessions(path, tmp_path):  # the exact form, with onnxruntime's optimizations and without
        assert [_onnx_actor(session)(s) for s in states] == reference
        assert session.run(["action"], {"observations": states})[0].tolist() == reference
    _assert_exact_on_an_emulated_avx2_cpu(tmp_path / "low_bit.onnx", states, reference, tmp_path / "avx2")
    from compress_dqn.deploy.micro import MicroPolicy
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.micro.cpp import export as export_micro

    micro = export_micro(path, tmp_path / "micro", ExportOptions())  # TFLM runs the INT4 kernel, unpacked into its arena
    assert micro.runs and micro.arena_bytes > 16 * 8 * 8 * 4
    assert MicroPolicy(path).actions(states[:200]).tolist() == reference[:200]


# Dynamic-range files: the tiny run's is float throughout (the converter keeps layers under 1,024 weights
# in float), so these build files whose layers LiteRT runs with its hybrid kernels.

def _dynamic_range_file(folder: Path, name: str, layers: list, obs_shape: tuple, dtype: type) -> Path:
    """A `quantize: {mode: dynamic}` policy file of the given Keras layers (seeded, biases non-zero), split heads."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import converter_setup
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.deploy.tflite.outputs import with_float_q_values
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig

    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input(obs_shape), *layers])
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if layer.get_weights():
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, rng.normal(0, 0.1, bias.shape).astype(np.float32)])
    saved = export_saved_model(split_value_advantage(model), obs_shape, dtype, folder / f"{name}_saved")
    path = folder / f"{name}.tflite"
    path.write_bytes(with_float_q_values(convert_tflite(saved, converter_setup(QuantizeConfig(mode="dynamic")))))
    return path


def _hybrid_form(path: Path, symmetric: bool, per_tensor: bool) -> Path:
    """The file with its hybrid ops switched to LiteRT's other hybrid paths: symmetric input quantization
    (asymmetric_quantize_inputs off) and one weight scale (FULLY_CONNECTED: one scale; CONV_2D: equal scales)."""
    from ai_edge_litert import schema_py_generated as schema

    from compress_dqn.deploy.tflite.metadata import pack_model

    model = schema.ModelT.InitFromPackedBuf(bytearray(path.read_bytes()), 0)
    graph, ops = model.subgraphs[0], schema.BuiltinOperator
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        kind = max(code.builtinCode, code.deprecatedBuiltinCode)
        weights = graph.tensors[op.inputs[1]] if kind in (ops.FULLY_CONNECTED, ops.CONV_2D) else None
        if weights is None or weights.type != schema.TensorType.INT8:
            continue
        if symmetric and kind == ops.FULLY_CONNECTED:
            op.builtinOptions.asymmetricQuantizeInputs = False
        if per_tensor:
            count = 1 if kind == ops.FULLY_CONNECTED else len(weights.quantization.scale)
            weights.quantization.scale = [float(np.max(weights.quantization.scale))] * count
            weights.quantization.zeroPoint = [0] * count
    out = path.with_name(f"{path.stem}-{'sym' if symmetric else 'asym'}-{'tensor' if per_tensor else 'channel'}.tflite")
    out.write_bytes(pack_model(model, path.stat().st_size))
    return out


def _values_differ(path: Path, folder: Path, states: np.ndarray) -> int:
    """States where the C's values that its action is the argmax of differ in any bit from LiteRT's reference kernels'."""
    import ctypes
    import dataclasses
    import re

    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import compile_shared
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    policy = generate_c(path, "vals")
    found = re.search(r"return argmax_f32\((t\d+), (\d+)\);", policy.source)
    n = int(found.group(2))
    source = policy.source.replace("int vals_act(", f"float vals_values[{n}];\nint vals_act(", 1).replace(
        found.group(0), f"for (int i = 0; i < {n}; ++i) vals_values[i] = {found.group(1)}[i];\n  {found.group(0)}")
    folder = folder / path.stem  # a library of its own: dlopen would hand back one already loaded from the same path
    folder.mkdir()
    lib = compile_shared(dataclasses.replace(policy, source=source), folder)
    act, ours = lib.vals_act, (ctypes.c_float * n).in_dll(lib, "vals_values")
    interp = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                         experimental_preserve_all_tensors=True)
    interp.allocate_tensors()
    index = next(op for op in read_policy_graph(path).ops if op.kind == "ARG_MAX").inputs[0].index
    differ = 0
    for state in states:
        x = np.ascontiguousarray(state[None], dtype=states.dtype)
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        act(x.ctypes.data_as(ctypes.c_void_p))
        differ += not np.array_equal(interp.get_tensor(index).ravel().view(np.int32), np.array(ours, np.float32).view(np.int32))
    return differ


def _edge_states(n: int, rng: np.random.Generator) -> np.ndarray:
    """States whose quantization lands on LiteRT's rounding edges (scale 1, so a value is its own product): the
    float below 0.5 (LiteRT rounds it up in its loop of 8, down after it), ranges whose float width loses
    bits, zeros; then random ones."""
    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    edges = []
    for top, sign in ((255, 1), (-255, -1), (127, 1), (127, -1)):
        s = np.full(n, sign * below_half, np.float32)
        s[0] = top
        edges.append(s)
    for _ in range(100):
        s = np.abs(rng.normal(0, 1, n)).astype(np.float32) * np.float32(rng.uniform(0.5, 4))
        s[1] = -np.float32(rng.uniform(0, 3e-7))
        edges.append(s)
    edges.append(np.zeros(n, np.float32))
    spread = rng.normal(0, 1.5, (300, n)) * rng.choice([0.01, 1, 100], (300, 1))
    return np.concatenate([np.stack(edges), spread]).astype(np.float32)


@pytest.mark.slow
def test_a_dynamic_range_policy_in_c_computes_what_litert_s_hybrid_kernels_compute(tmp_path):
    """A CartPole-shaped dynamic-range policy (hybrid FULLY_CONNECTED: its input quantized per call) plays
    action for action as LiteRT's reference kernels; its Q-values are bit for bit theirs on LiteRT's four
    hybrid paths (asymmetric or symmetric input, per-channel or per-tensor weights) and on rounding edges."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    dense = tf_keras.layers.Dense
    path = _dynamic_range_file(tmp_path, "cartpole", [dense(256, activation="relu", name="hidden_0"),
                                                      dense(256, activation="relu", name="hidden_1"), dense(2, name="q_values")],
                               (4,), np.float32)
    hybrid = [op for op in read_policy_graph(path).ops if op.kind == "FULLY_CONNECTED" and op.inputs[1].dtype == np.int8]
    assert len(hybrid) == 2 and all(op.inputs[0].dtype == np.float32 and op.options["asymmetricQuantizeInputs"] for op in hybrid)
    policy = generate_c(path, "dyn")
    assert not policy.integer and "fc_hybrid(" in policy.source and "fc_f32(" in policy.source  # the heads stay float
    act = c_actor(compile_shared(policy, tmp_path), policy)
    states = np.random.default_rng(0).normal(0, 1.5, (300, 4)).astype(np.float32)
    differ, steps = _play_side_by_side(act, TFLitePolicy(path, reference_kernels=True).act, "CartPole-v1", range(EPISODES), states)
    assert differ == 0 and steps > len(states)
    assert len({act(s) for s in states}) > 1
    # 20 inputs: 16 quantized in LiteRT's loop of 8, 4 after it, so both roundings meet the edge states.
    wide = _dynamic_range_file(tmp_path, "wide", [dense(64, activation="relu", name="hidden_0"),
                                                  dense(64, activation="relu", name="hidden_1"), dense(3, name="q_values")],
                               (20,), np.float32)
    for symmetric in (False, True):
        for per_tensor in (False, True):
            for file, n in ((path, 4), (wide, 20)):
                form = _hybrid_form(file, symmetric, per_tensor)
                assert _values_differ(form, tmp_path, _edge_states(n, np.random.default_rng(1))) == 0, form.name


@pytest.mark.slow
def test_a_dynamic_range_cnn_in_c_plays_as_litert_s_hybrid_kernels(tmp_path):
    """A MinAtar-shaped dynamic-range CNN: its CONV_2D (1,152 weights) and dense layer run as LiteRT's hybrid
    kernels, per channel (asymmetric input) and with one scale (symmetric)."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.deploy.c.source import generate_c
    from compress_dqn.deploy.c.measure import c_actor, compile_shared
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    layers = tf_keras.layers
    path = _dynamic_range_file(tmp_path, "cnn", [layers.Conv2D(32, 3, activation="relu", name="conv_0"), layers.Flatten(name="flatten"),
                                                 layers.Dense(32, activation="relu", name="hidden_0"), layers.Dense(3, name="q_values")],
                               (10, 10, 4), np.uint8)
    conv = next(op for op in read_policy_graph(path).ops if op.kind == "CONV_2D")
    assert conv.inputs[0].dtype == np.float32 and conv.inputs[1].dtype == np.int8 and conv.inputs[1].scales.size == 32
    policy = generate_c(path, "dyncnn")
    assert "conv_hybrid(" in policy.source and "fc_hybrid(" in policy.source and policy.obs_type == "uint8_t"
    act = c_actor(compile_shared(policy, tmp_path), policy)
    states = np.random.default_rng(1).integers(0, 2, (500, 10, 10, 4)).astype(np.uint8)
    differ, steps = _play_side_by_side(act, TFLitePolicy(path, reference_kernels=True).act, "MinAtar/Breakout-v1", range(2), states)
    assert differ == 0 and steps > len(states)
    assert len({act(s) for s in states[:200]}) > 1
    for per_tensor in (False, True):
        assert _values_differ(_hybrid_form(path, False, per_tensor), tmp_path, states[:200]) == 0, per_tensor


def _onnx_session(path: Path, folder: Path):
    """onnxruntime's session on the `export --target onnx` file of a .tflite policy."""
    import onnxruntime as ort

    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.onnx.export import export as export_onnx

    out = folder / f"{path.stem}.onnx"
    export_onnx(path, out, ExportOptions())
    return ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def _onnx_sessions(path: Path, folder: Path, int8: str = "exact") -> list:
    """onnxruntime's sessions on the export, with its default graph optimizations (which fuse kernels by CPU)
    and with them off, one thread each."""
    import onnxruntime as ort

    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.onnx.export import export as export_onnx

    out = folder / f"{path.stem}.onnx"
    export_onnx(path, out, ExportOptions(onnx_int8=int8))
    sessions = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level, options.intra_op_num_threads = level, 1
        sessions.append(ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]))
    return sessions


def _assert_exact_on_an_emulated_avx2_cpu(onnx_file: Path, states: np.ndarray, reference: list[int], folder: Path) -> None:
    """onnxruntime picks its kernels by the CPU's instruction sets; an AVX2-only CPU (where QDQ's fused s8s8
    kernels took other actions) is checked under qemu-user's Haswell, onnxruntime alone in the emulator."""
    import os
    import shutil

    if shutil.which("qemu-x86_64") is None:
        if os.environ.get("CI"):
            pytest.fail("qemu-x86_64 is missing: .ci/run installs Debian's qemu-user for this check")
        pytest.skip("qemu-x86_64 not installed (apt-get install qemu-user): the AVX2 check needs it")
    folder.mkdir()
    np.savez(folder / "policy.npz", states=states, actions=np.asarray(reference, np.int64))
    shutil.copy(onnx_file, folder / "policy.exact.onnx")
    done = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", sys.executable, str(HERE.parent / "benchmarks" / "onnx_exactness.py"),
                           "count", str(folder), "--forms", "exact"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    *rows, cpu = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert cpu["AVX2"] and not cpu["AVX512F"] and not cpu["AVX512VNNI"], cpu  # the emulated CPU, not the host's
    assert rows and all(row[k] == 0 for row in rows for k in row if k.startswith("differ")), rows


def _onnx_actor(session):
    def act(obs: np.ndarray) -> int:
        return int(session.run(["action"], {"observations": np.asarray(obs)[None]})[0][0])

    return act


def _rows_not_bit_identical(ours: np.ndarray, theirs: np.ndarray) -> int:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    return int(np.sum(np.any(ours.view(np.int32) != theirs.view(np.int32), axis=1)))


def _onnx_q_values_differ(path: Path, folder: Path, states: np.ndarray) -> tuple[int, int]:
    """(rows of q_values not bit for bit LiteRT's reference kernels', one state a call; the same, one batch of all)."""
    session, reference = _onnx_session(path, folder), TFLitePolicy(path, reference_kernels=True)
    one = np.concatenate([session.run(["q_values"], {"observations": s[None]})[0] for s in states])
    theirs = np.concatenate([reference.q_values(s[None]) for s in states])
    batch = session.run(["q_values"], {"observations": states})[0]
    return _rows_not_bit_identical(one, theirs), _rows_not_bit_identical(batch, reference.q_values(states))


@pytest.mark.slow
def test_a_dynamic_range_policy_in_onnx_plays_as_litert_s_hybrid_kernels(tmp_path):
    """The ONNX of a CartPole-shaped dynamic-range policy runs LiteRT's hybrid arithmetic (its two hidden layers'
    input quantized per call, integer products, float scales; its small heads stay float): it takes the action of
    LiteRT's reference kernels and of its default ones on every state, and an outsider playing it with
    onnxruntime alone gets evaluate's returns."""
    import onnx

    from compress_dqn._tf import tf_keras
    from compress_dqn.cli import main

    dense = tf_keras.layers.Dense
    path = _dynamic_range_file(tmp_path, "cartpole", [dense(256, activation="relu", name="hidden_0"),
                                                      dense(256, activation="relu", name="hidden_1"), dense(2, name="q_values")],
                               (4,), np.float32)
    out = tmp_path / "cartpole.onnx"
    result = CliRunner().invoke(main, ["export", str(path), "--target", "onnx", "--out", str(out)])
    assert result.exit_code == 0, result.output
    kinds = [node.op_type for node in onnx.load(str(out)).graph.node]
    assert kinds.count("MatMulInteger") == 2 and kinds.count("Gemm") == 2 and "Round" not in kinds
    import onnxruntime as ort

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    act = _onnx_actor(session)
    states = np.random.default_rng(0).normal(0, 1.5, (300, 4)).astype(np.float32)
    for reference_kernels in (True, False):
        theirs = TFLitePolicy(path, reference_kernels=reference_kernels)
        differ, steps = _play_side_by_side(act, theirs.act, "CartPole-v1", range(EPISODES), states)
        assert differ == 0 and steps > len(states), reference_kernels
        # The float heads sum in onnxruntime's order, not LiteRT's: their last bits may differ.
        q = theirs.q_values(states)
        np.testing.assert_allclose(session.run(["q_values"], {"observations": states})[0], q, rtol=0, atol=1e-5 * np.abs(q).max())
    assert len({act(s) for s in states}) > 1
    done = subprocess.run([sys.executable, str(HERE / "outsider_onnx_player.py"), str(out), "CartPole-v1", "0", str(EPISODES)],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["returns"] == _evaluate(path)


@pytest.mark.slow
def test_a_fully_hybrid_policy_in_onnx_gives_litert_s_q_values_bit_for_bit(tmp_path):
    """Every layer hybrid (1,028 hidden units: both heads hold >= 1,024 weights), 20 inputs (16 quantized in
    LiteRT's loop of 8, 4 after it; the hidden layer's 1,028 likewise): the ONNX's q_values are LiteRT's
    reference kernels' bit for bit on its four hybrid paths and the rounding edges, one state a call and in
    one batch (each row quantized alone)."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    dense = tf_keras.layers.Dense
    path = _dynamic_range_file(tmp_path, "hybrid", [dense(1028, activation="relu", name="hidden_0"), dense(3, name="q_values")],
                               (20,), np.float32)
    fcs = [op for op in read_policy_graph(path, ("action", "q_values")).ops if op.kind == "FULLY_CONNECTED"]
    assert len(fcs) == 3 and all(op.inputs[1].dtype == np.int8 for op in fcs)
    states = _edge_states(20, np.random.default_rng(1))
    for symmetric in (False, True):
        for per_tensor in (False, True):
            form = _hybrid_form(path, symmetric, per_tensor)
            assert _onnx_q_values_differ(form, tmp_path, states) == (0, 0), form.name
    session = _onnx_session(path, tmp_path)
    assert len({_onnx_actor(session)(s) for s in states}) > 1


@pytest.mark.slow
def test_a_dynamic_range_cnn_in_onnx_plays_as_litert_s_hybrid_kernels(tmp_path):
    """A MinAtar-shaped CNN, every layer hybrid: a 4x4 SAME conv (1,024 weights, padding 1 before and 2 after),
    a 3x3 stride-2 SAME one (padding only after) and heads on its 1,200 features. Its ONNX's q_values are
    LiteRT's reference kernels' bit for bit, per channel (asymmetric input) and with one scale (symmetric),
    and it takes their action, and that of LiteRT's default kernels, on every state of two episodes."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    layers = tf_keras.layers
    path = _dynamic_range_file(tmp_path, "cnn", [layers.Conv2D(16, 4, padding="same", activation="relu", name="conv_0"),
                                                 layers.Conv2D(48, 3, strides=2, padding="same", activation="relu", name="conv_1"),
                                                 layers.Flatten(name="flatten"), layers.Dense(3, name="q_values")],
                               (10, 10, 4), np.uint8)
    ops = read_policy_graph(path, ("action", "q_values")).ops
    assert [op.kind for op in ops if op.kind in ("CONV_2D", "FULLY_CONNECTED")] == ["CONV_2D"] * 2 + ["FULLY_CONNECTED"] * 2
    assert all(op.inputs[1].dtype == np.int8 for op in ops if op.kind in ("CONV_2D", "FULLY_CONNECTED"))
    rng = np.random.default_rng(1)
    states = np.concatenate([np.zeros((1, 10, 10, 4)), np.ones((1, 10, 10, 4)), rng.integers(0, 2, (300, 10, 10, 4))]).astype(np.uint8)
    for per_tensor in (False, True):
        form = _hybrid_form(path, False, per_tensor)
        assert _onnx_q_values_differ(form, tmp_path, states) == (0, 0), form.name
    act = _onnx_actor(_onnx_session(path, tmp_path))
    for reference_kernels in (True, False):
        theirs = TFLitePolicy(path, reference_kernels=reference_kernels).act
        differ, steps = _play_side_by_side(act, theirs, "MinAtar/Breakout-v1", range(2), states[:100])
        assert differ == 0 and steps > 100, reference_kernels
    assert len({act(s) for s in states[:200]}) > 1


@pytest.mark.parametrize("defines", [(), ("POLICY_PORTABLE_FC_SCALE",)], ids=["host", "portable"])
def test_fc_scale_rounds_as_double_round(tmp_path, defines):
    """fc_scale(acc, m, s) == round((double)acc * M) (ties away), for M = m * 2^-s: LiteRT's reference
    requantization; both the 64-bit hosts' path and the portable one (microcontrollers)."""
    import ctypes
    import math

    from compress_dqn.deploy.c.source import CPolicy
    from compress_dqn.deploy.c.measure import compile_shared
    from compress_dqn.deploy.c.runtime import routines

    source = ('#include "fcs.h"\n#include <stdint.h>\n' + routines({"fc_scale"})
              + "int32_t fcs_apply(int32_t acc, uint64_t m, int s) { return fc_scale(acc, m, s); }\n"
              "int fcs_act(const float *o) { return (int)o[0]; }\n")
    header = "#include <stdint.h>\n#define FCS_OBS_SIZE 1\nint fcs_act(const float *o);\n"
    lib = compile_shared(CPolicy("fcs", source, header, "float", 1, 1, True, 0), tmp_path, defines=defines)
    lib.fcs_apply.restype, lib.fcs_apply.argtypes = ctypes.c_int32, [ctypes.c_int32, ctypes.c_uint64, ctypes.c_int]
    rng = np.random.default_rng(0)
    ties = 0
    for _ in range(30000):
        multiplier = float(np.float32(rng.uniform(1e-5, 2e-2))) * float(np.float32(rng.uniform(0.5, 2)))
        if rng.random() < 0.05:
            multiplier = 2.0 ** -int(rng.integers(3, 12))  # exact ties: acc * M lands on k + 1/2
        acc = int(rng.integers(-(1 << 24), 1 << 24))
        if rng.random() < 0.3:  # aim at a tie: acc * M close to k + 1/2
            acc = max(1, int(round((int(rng.integers(-100, 100)) + 0.5) / multiplier)))
        fraction, exponent = math.frexp(multiplier)
        exact = acc * multiplier
        expected = int(math.copysign(math.floor(abs(exact) + 0.5), exact))
        ties += abs(abs(exact) % 1 - 0.5) < 1e-9
        assert lib.fcs_apply(acc, int(fraction * (1 << 53)), 53 - exponent) == expected, (acc, multiplier)
    assert ties > 100  # the half-way cases were tried


@pytest.mark.slow
def test_export_c_writes_the_files_and_measures_cortex_m_flash_and_ram(tiny_run, tmp_path):
    from compress_dqn.cli import main

    policy = _policies(tiny_run)["student-qat"]
    result = CliRunner().invoke(main, ["export", str(policy), "--target", "c", "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (tmp_path / "c" / "student_qat.c").exists() and "int student_qat_act(const float *observation);" in (
        tmp_path / "c" / "student_qat.h").read_text()
    assert report["mcu"]["measured"], report["mcu"]
    assert report["form"] == "dense" and "dense_mcu" not in report  # a dense student: nothing to compress
    for target in ("cortex-m0plus", "cortex-m4f"):
        figures = report["mcu"]["targets"][target]
        assert figures["flash_bytes"] == figures["text"] + figures["rodata"] + figures["data"] > report["constants_bytes"]
        assert figures["ram_bytes"] == figures["data"] + figures["bss"] + figures["stack"] > 16  # the observation at least
    # On Cortex-M0+ the 64-bit multiplies and float arithmetic are library code: more flash than on an M4F.
    assert report["mcu"]["targets"]["cortex-m0plus"]["flash_bytes"] > report["mcu"]["targets"]["cortex-m4f"]["flash_bytes"]
    assert report["time_per_action"]["c_ns"] > 0 and report["time_per_action"]["litert_invoke_ns"] > 0
    from compress_dqn.deploy.c.measure import c_summary

    summary = c_summary(policy)  # the record the measure stage keeps beside TFLM's micro summary
    assert summary.translated and summary.integer_only and summary.reason is None
    for target in ("cortex-m0plus", "cortex-m4f"):
        assert summary.on(target) == (report["mcu"]["targets"][target]["flash_bytes"], report["mcu"]["targets"][target]["ram_bytes"])
    assert summary.counts == report["mcu"]["counts"]


def test_a_policy_the_c_export_cannot_translate_gets_its_reason_not_an_error(tmp_path):
    from compress_dqn.deploy.c.measure import c_summary

    (tmp_path / "policy.tflite").write_bytes(b"not a flatbuffer at all")
    summary = c_summary(tmp_path / "policy.tflite")
    assert not summary.translated and summary.reason and summary.on("cortex-m4f") is None
    assert summary.flash_bytes is None and summary.integer_only is None


def _evaluate(policy: Path) -> list[float]:
    from compress_dqn.cli import main

    result = CliRunner().invoke(main, ["evaluate", str(policy), "--env", "CartPole-v1", "--episodes", str(EPISODES)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["return"]["episodes"]


@pytest.mark.slow
def test_an_outsiders_onnxruntime_player_gets_evaluates_returns_on_every_variant(tiny_run, tmp_path):
    from compress_dqn.cli import main

    for name, policy in _policies(tiny_run).items():
        onnx_file = tmp_path / f"{name}.onnx"
        result = CliRunner().invoke(main, ["export", str(policy), "--target", "onnx", "--out", str(onnx_file)])
        assert result.exit_code == 0, result.output
        done = subprocess.run([sys.executable, str(HERE / "outsider_onnx_player.py"), str(onnx_file), "CartPole-v1", "0",
                               str(EPISODES)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        played = json.loads(done.stdout)
        assert played["returns"] == _evaluate(policy), name
        assert played["q_argmax_differs"] == 0, name


@pytest.mark.slow
def test_every_int8_variant_in_onnx_acts_as_the_reference_kernels_and_keeps_the_output_rule(tiny_run, tmp_path):
    """The exact form (the default) repeats LiteRT's reference int8 kernels in integer ops: the reference's
    action on every state, with onnxruntime's graph optimizations and without. The qdq form leaves rounding
    to the CPU's fused kernels, so only the output rule is asserted there: argmax(q_values) is its action."""
    import onnx

    heldout = np.load(tiny_run / "baseline" / "heldout_obs.npz")["observations"][:1000].astype(np.float32)
    states = np.concatenate([heldout, np.random.default_rng(3).normal(0, 1.5, (1000, 4)).astype(np.float32)])
    for name in ("ptq-int8", "qat-int8", "student-qat"):
        path = _policies(tiny_run)[name]
        reference = TFLitePolicy(path, reference_kernels=True).actions(states).tolist()
        for session in _onnx_sessions(path, tmp_path):
            assert session.run(["action"], {"observations": states})[0].tolist() == reference, name
            assert [_onnx_actor(session)(s) for s in states[::10]] == reference[::10], name
        kinds = {node.op_type for node in onnx.load(str(tmp_path / "policy.onnx")).graph.node}
        assert "MatMulInteger" in kinds and "QuantizeLinear" not in kinds, kinds
        for session in _onnx_sessions(path, tmp_path, int8="qdq"):
            action, q = session.run(["action", "q_values"], {"observations": states})
            assert np.array_equal(action, q.argmax(axis=1)), name
        assert "QuantizeLinear" in {node.op_type for node in onnx.load(str(tmp_path / "policy.onnx")).graph.node}


@pytest.mark.slow
def test_an_outside_client_playing_argmax_q_values_gets_evaluates_return(tiny_run):
    for name, policy in _policies(tiny_run).items():
        done = subprocess.run([sys.executable, str(HERE / "outsider_player.py"), str(policy), "CartPole-v1", "0",
                               str(EPISODES), "q_values"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        played = json.loads(done.stdout)
        assert played["q_argmax_differs"] == 0, name
        assert played["returns"] == _evaluate(policy), name


def test_the_onnx_player_imports_nothing_of_compress_dqn():
    source = (HERE / "outsider_onnx_player.py").read_text()
    assert "compress_dqn" not in source.split('"""', 2)[2]


@pytest.mark.slow
@pytest.mark.skipif(not __import__("compress_dqn.deploy.micro", fromlist=["available"]).available(),
                    reason="tflite-micro not installed: pip install 'compress-dqn[micro]'")
def test_tflm_s_q_values_argmax_is_its_action_on_every_variant(tiny_run):
    """The output rule under TensorFlow Lite Micro too: it runs the same graph with its own kernels."""
    from compress_dqn.deploy.micro import MicroPolicy

    states = np.random.default_rng(2).normal(0, 1.5, (300, 4)).astype(np.float32)
    for name, path in _policies(tiny_run).items():
        if name in ("ptq-dynamic", "ptq-float16"):  # TFLM runs neither hybrid kernels nor float16 weights
            continue
        policy = MicroPolicy(path)
        assert np.array_equal(np.argmax(policy.q_values(states), axis=1), policy.actions(states)), name
