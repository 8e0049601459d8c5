"""Post-training quantization and QAT: the TFLite files hold the promised tensor types."""

import numpy as np
import pytest

from compress_dqn.compress.build import build_variant
from compress_dqn.compress.build import dense_kernels
from compress_dqn.convert.conversion import convert_policy
from compress_dqn.deploy.tflite.graph_input import graph_normalization
from compress_dqn.deploy.litert.policy import TFLitePolicy

from conftest import variant


def tflite_for(trained_tiny, tmp_path, **fields):
    recipe, result = trained_tiny
    built = build_variant(variant(recipe, **fields), result.model, result.replay, recipe, result.info, quiet=True)
    check = result.replay.sample_observations(100)
    convert_policy(built.export_model, result.info, tmp_path, built, check)  # as the pipeline does
    return tmp_path / "policy.tflite", built


def weight_dtypes(path):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    return {np.dtype(t["dtype"]).name for t in interp.get_tensor_details() if len(t["shape"]) == 2 and 32 in t["shape"]}


def agreement(path, trained_tiny):
    _, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(500)).observations
    lite = TFLitePolicy(path).q_values(obs).argmax(1)
    return float(np.mean(lite == result.model(obs).numpy().argmax(1)))


def test_int8_has_int8_weights_and_keeps_actions(trained_tiny, tmp_path):
    path, built = tflite_for(trained_tiny, tmp_path, quantize={"mode": "int8", "calibration_samples": 200})
    assert "int8" in weight_dtypes(path)
    assert built.input_normalization is not None and graph_normalization(path.read_bytes()) is not None  # in its graph
    assert agreement(path, trained_tiny) > 0.9


def fully_connected_ops(path):
    from ai_edge_litert.interpreter import Interpreter

    return [op for op in Interpreter(model_path=str(path))._get_ops_details() if op["op_name"] == "FULLY_CONNECTED"]


def test_int8_action_head_and_range_scaling(trained_tiny, tmp_path):
    plain, _ = tflite_for(trained_tiny, tmp_path / "plain", quantize={"mode": "int8", "calibration_samples": 200})
    path, built = tflite_for(trained_tiny, tmp_path / "head", quantize={
        "mode": "int8", "calibration_samples": 200, "action_head": True, "input_scaling": "range"})
    # A fifth int8 FULLY_CONNECTED (two hidden layers, advantage, value, the action's head) feeds
    # the action: ARG_MAX reads a tensor on ReLU6's range, [0, 6] in 256 steps.
    assert len(fully_connected_ops(plain)) == 4 and len(fully_connected_ops(path)) == 5
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    (arg_max,) = [op for op in interp._get_ops_details() if op["op_name"] == "ARG_MAX"]
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    scale, zero_point = tensors[arg_max["inputs"][0]]["quantization"]
    assert zero_point == -128 and scale == pytest.approx(6 / 255, rel=1e-3)
    policy = TFLitePolicy(path)
    in_graph = graph_normalization(path.read_bytes())  # the file computes (obs - midrange) / half-range
    np.testing.assert_allclose(in_graph.mean, built.input_normalization.mean)
    np.testing.assert_allclose(np.abs(built.calibration).max(0), 1.0, atol=1e-5)
    assert agreement(path, trained_tiny) > 0.9
    _, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(500)).observations
    float_actions = result.model(obs).numpy().argmax(1)
    assert np.mean(policy.actions(obs) == float_actions) >= np.mean(TFLitePolicy(plain).actions(obs) == float_actions) - 0.02


def test_int8_io_makes_input_int8(trained_tiny, tmp_path):
    path, _ = tflite_for(trained_tiny, tmp_path, quantize={"mode": "int8", "int8_io": True, "calibration_samples": 200})
    policy = TFLitePolicy(path)
    assert policy.input_dtype == np.int8
    assert agreement(path, trained_tiny) > 0.9
    obs = np.random.default_rng(5).normal(0, 1, size=(50, 4))
    # act() quantizes one float observation (any float dtype, or a list) as actions() does a batch.
    batch = policy.actions(obs.astype(np.float32)).tolist()
    assert [policy.act(o) for o in obs] == batch
    assert [policy.act(o.astype(np.float32).tolist()) for o in obs] == batch


def test_float16_has_float16_weights(trained_tiny, tmp_path):
    path, _ = tflite_for(trained_tiny, tmp_path, quantize={"mode": "float16"})
    assert "float16" in weight_dtypes(path)


def test_qat_model_converts_to_int8(trained_tiny, tmp_path):
    path, built = tflite_for(trained_tiny, tmp_path, quantize={"mode": "qat"}, fine_tune={"steps": 100})
    assert built.details.qat.preserve is None
    assert "int8" in weight_dtypes(path)
    assert agreement(path, trained_tiny) > 0.8


def test_qat_float_head_leaves_the_heads_in_float_and_the_body_int8(trained_tiny, tmp_path):
    """quantize.float_head: the action is chosen on float advantages (no int8 step to tie them)."""
    from ai_edge_litert.interpreter import Interpreter

    path, _ = tflite_for(trained_tiny, tmp_path, quantize={"mode": "qat", "float_head": True}, fine_tune={"steps": 100})
    interp = Interpreter(model_path=str(path))
    tensors = interp.get_tensor_details()
    fully_connected = [[np.dtype(tensors[i]["dtype"]).name for i in op["inputs"][:2]]
                       for op in interp._get_ops_details() if op["op_name"] == "FULLY_CONNECTED"]
    assert fully_connected[:-2] and all(types == ["int8", "int8"] for types in fully_connected[:-2])
    assert fully_connected[-2:] == [["float32", "float32"]] * 2  # advantage and value
    assert [op["op_name"] for op in interp._get_ops_details()][-1] == "ARG_MAX"
    assert agreement(path, trained_tiny) > 0.8
    _, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(500)).observations
    policy = TFLitePolicy(path)
    np.testing.assert_array_equal(policy.actions(obs), policy.q_values(obs).argmax(1))


def test_float_head_is_for_qat_only():
    from pydantic import ValidationError

    from compress_dqn.recipe.schema import QuantizeConfig

    with pytest.raises(ValidationError, match="float_head applies to mode qat only"):
        QuantizeConfig(mode="int8", float_head=True)


def test_qat_teacher_float_distils_to_the_float_model_it_starts_from(trained_tiny, tmp_path, monkeypatch):
    """quantize.qat_teacher: float: QAT's targets come from the student's own float weights, held
    fixed while the fake-quantized copy trains; the default keeps the baseline as the teacher."""
    from compress_dqn.compress import build

    teachers = {}
    real = build.fine_tune

    def spy(model, ft, recipe, teacher, replay, *args, **kwargs):
        if kwargs.get("label", "").endswith("/qat"):
            teachers[kwargs["label"]] = (teacher, [w.copy() for w in teacher.get_weights()])
        return real(model, ft, recipe, teacher, replay, *args, **kwargs)

    monkeypatch.setattr(build, "fine_tune", spy)
    _, result = trained_tiny
    student = {"student": {"net_arch": [16]}, "fine_tune": {"steps": 50}}
    tflite_for(trained_tiny, tmp_path / "self", **student, quantize={"mode": "qat", "qat_steps": 50, "qat_teacher": "float"})
    teacher, before = teachers.pop("v/qat")
    assert [w.shape for w in teacher.get_weights()] != [w.shape for w in result.model.get_weights()]  # the 16-unit student
    for held, after in zip(before, teacher.get_weights()):  # frozen through the QAT steps
        np.testing.assert_array_equal(held, after)
    tflite_for(trained_tiny, tmp_path / "baseline", **student, quantize={"mode": "qat", "qat_steps": 50})
    assert teachers.pop("v/qat")[0] is result.model


def test_qat_teacher_is_for_qat_distillation_only():
    from pydantic import ValidationError

    from compress_dqn.recipe.schema import QuantizeConfig, VariantConfig

    with pytest.raises(ValidationError, match="qat_teacher applies to mode qat only"):
        QuantizeConfig(mode="int8", qat_teacher="float")
    with pytest.raises(ValidationError, match="fine_tune.method must be distill"):
        VariantConfig(name="v", quantize={"mode": "qat", "qat_teacher": "float"}, fine_tune={"method": "td"})


def test_candidates_qat_teachers_are_for_qat_each_named_once():
    from pydantic import ValidationError

    from compress_dqn.recipe.schema import VariantConfig

    both = {"count": 2, "qat_teachers": ["baseline", "float"]}
    assert VariantConfig(name="v", quantize={"mode": "qat"}, candidates=both).candidates.qat_teachers == ["baseline", "float"]
    with pytest.raises(ValidationError, match="need quantize.mode: qat"):
        VariantConfig(name="v", quantize={"mode": "int8"}, candidates=both)
    with pytest.raises(ValidationError, match="not both"):
        VariantConfig(name="v", quantize={"mode": "qat", "qat_teacher": "float"}, candidates=both)
    with pytest.raises(ValidationError, match="fine_tune.method must be distill"):
        VariantConfig(name="v", quantize={"mode": "qat"}, fine_tune={"method": "td"}, candidates=both)
    with pytest.raises(ValidationError, match="list each teacher once"):
        VariantConfig(name="v", quantize={"mode": "qat"}, candidates={"qat_teachers": ["float", "float"]})


def test_pqat_keeps_sparsity_through_qat(trained_tiny, tmp_path):
    path, built = tflite_for(trained_tiny, tmp_path, prune={"sparsity": 0.9, "frequency": 5},
                             quantize={"mode": "qat"}, fine_tune={"steps": 150})
    assert built.details.qat.preserve == "sparsity"
    before, after = built.details.sparsity, built.details.sparsity_after_qat
    # Every exported kernel (the output layer as its advantage and value heads) keeps its zeros.
    assert set(after) == set(before) == {"hidden_0", "hidden_1", "advantage", "value"}
    for layer in after:
        assert abs(after[layer] - before[layer]) <= 0.01, layer
    assert abs(after["hidden_0"] - 0.9) <= 0.01 and abs(after["hidden_1"] - 0.9) <= 0.01
    assert "int8" in weight_dtypes(path)


def test_plain_qat_does_not_keep_sparsity(trained_tiny, tmp_path):
    """Control for the PQAT test: without the preserving scheme, QAT refills pruned weights."""
    _, built = tflite_for(trained_tiny, tmp_path, prune={"sparsity": 0.9, "frequency": 5},
                          quantize={"mode": "qat", "preserve": False}, fine_tune={"steps": 150})
    assert built.details.qat.preserve is None
    assert built.details.sparsity_after_qat is None
    kernel = dense_kernels(built.export_model)["hidden_1"]
    assert abs(built.details.sparsity["hidden_1"] - 0.9) <= 0.01  # pruned before QAT ...
    assert 1.0 - np.count_nonzero(kernel) / kernel.size < 0.5  # ... and refilled by plain QAT


@pytest.mark.parametrize("mode", ["dynamic", "int16x8"])
def test_other_modes_convert_and_act(trained_tiny, tmp_path, mode):
    path, _ = tflite_for(trained_tiny, tmp_path, quantize={"mode": mode, "calibration_samples": 100})
    assert agreement(path, trained_tiny) > 0.9


def test_qat_runs_on_normalized_input(trained_tiny, tmp_path):
    """QAT gives each input feature its own range as post-training int8 does: the fine-tune trains
    the fake-quantized model behind a fixed normalization layer, and the .tflite (which normalizes
    raw observations in its graph) computes what the SavedModel computes on raw ones."""
    path, built = tflite_for(trained_tiny, tmp_path, quantize={"mode": "qat", "qat_steps": 50}, fine_tune={"steps": 50})
    assert built.input_normalization is not None and graph_normalization(path.read_bytes()) is not None  # in its graph
    _, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(300)).observations
    advantage, value = built.export_model(obs)  # the split head, on raw observations
    served = advantage.numpy() + value.numpy()
    lite = TFLitePolicy(path).q_values(obs)
    assert np.mean(lite.argmax(1) == served.argmax(1)) > 0.95
    assert agreement(path, trained_tiny) > 0.9


def test_qat_starts_where_the_float_model_is():
    """Before its first training step the fake-quantized model already acts like the float one:
    calibrate_ranges sets the kernel ranges (tfmot leaves them at [-6, 6] until a training call)
    and every activation range, including the input quantizer's whatever Keras numbered it."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import calibrate_ranges, qat_model
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.rl.networks import build_q_network

    tf_keras.utils.set_random_seed(0)
    obs = (np.random.default_rng(0).normal(size=(3000, 4)) * [1.0, 1.0, 0.05, 0.5]).astype(np.float32)
    model = build_q_network((4,), 2, [32, 32])  # fitted so that both actions occur, as in CartPole
    q = np.stack([np.zeros(len(obs)), obs @ [0.5, -0.3, 20.0, 1.6]], axis=1).astype(np.float32)
    model.compile(optimizer=tf_keras.optimizers.Adam(3e-3), loss="mse")
    model.fit(obs[:1000], q[:1000], epochs=20, batch_size=64, verbose=0)
    model = split_value_advantage(model)
    qat_model(model)  # an earlier QAT model in the session: the next one's input layer is quantize_layer_1
    qat = qat_model(model)
    calibrate_ranges(qat, model, obs[:1000])
    held_out = obs[1000:]
    float_actions = model(held_out)[0].numpy().argmax(1)
    assert 0.1 < float_actions.mean() < 0.9
    assert np.mean(qat(held_out, training=False)[0].numpy().argmax(1) == float_actions) >= 0.95


def test_a_dense_layer_on_a_flattened_conv_output_becomes_an_equal_per_channel_conv(tmp_path):
    """quantize.per_channel_dense: the rewrite computes the same Q-values, and the QAT file gives the
    rewritten layer a scale per unit (tfmot's Dense config would give its kernel one)."""
    from ai_edge_litert.interpreter import Interpreter

    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import calibrate_ranges, converter_setup, qat_model
    from compress_dqn.compress.rewrites import flattened_dense_as_conv, split_value_advantage
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig
    from compress_dqn.rl.networks import q_from_outputs

    tf_keras.utils.set_random_seed(0)
    model = split_value_advantage(tf_keras.Sequential([
        tf_keras.Input((10, 10, 4)), tf_keras.layers.Conv2D(4, 3, activation="relu", name="conv_0"),
        tf_keras.layers.Flatten(name="flatten"), tf_keras.layers.Dense(16, activation="relu", name="hidden_0"),
        tf_keras.layers.Dense(8, activation="relu", name="hidden_1"), tf_keras.layers.Dense(3, name="q_values")]))
    states = np.random.default_rng(0).integers(0, 2, (300, 10, 10, 4)).astype(np.float32)
    rewritten = flattened_dense_as_conv(model)
    assert rewritten.get_layer("hidden_0").kernel.shape == (8, 8, 4, 16)
    assert isinstance(rewritten.get_layer("hidden_1"), tf_keras.layers.Dense)  # only the layer on the conv output
    np.testing.assert_allclose(q_from_outputs(rewritten(states)).numpy(), q_from_outputs(model(states)).numpy(), atol=1e-5)
    mlp = split_value_advantage(tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(8, name="hidden_0"),
                                                     tf_keras.layers.Dense(2, name="q_values")]))
    assert flattened_dense_as_conv(mlp) is mlp

    qat = qat_model(rewritten)
    calibrate_ranges(qat, rewritten, states)
    saved = export_saved_model(qat, (10, 10, 4), np.float32, tmp_path / "saved_model")
    path = tmp_path / "qat.tflite"
    path.write_bytes(convert_tflite(saved, converter_setup(QuantizeConfig(mode="qat"))))
    interp = Interpreter(model_path=str(path))
    kernels = {tuple(t["shape"]): len(t["quantization_parameters"]["scales"]) for t in interp.get_tensor_details()
               if np.dtype(t["dtype"]) == np.int8 and len(t["shape"]) == 4 and t["shape"][0] == 16}
    assert kernels == {(16, 8, 8, 4): 16}



def test_equalizing_the_units_that_feed_float_heads_keeps_the_q_values_and_gives_each_unit_one_range():
    """quantize.equalize: every live unit feeding the heads spans the widest unit's range on the
    states (the int8 tensor they share then has all its steps for each), the Q-values unchanged."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.rewrites import equalize_head_input, split_value_advantage
    from compress_dqn.recipe.schema import QuantizeConfig, VariantConfig
    from compress_dqn.rl.networks import q_from_outputs
    from compress_dqn.run.ladders import variant_name

    tf_keras.utils.set_random_seed(0)
    model = split_value_advantage(tf_keras.Sequential([
        tf_keras.Input((10, 10, 4)), tf_keras.layers.Conv2D(4, 3, activation="relu", name="conv_0"),
        tf_keras.layers.Flatten(name="flatten"), tf_keras.layers.Dense(16, activation="relu", name="hidden_0"),
        tf_keras.layers.Dense(3, name="q_values")]))
    kernel, bias = model.get_layer("hidden_0").get_weights()
    kernel[:, :4] *= 0.01  # four units with a hundredth of the others' range
    model.get_layer("hidden_0").set_weights([kernel, bias])
    states = np.random.default_rng(0).integers(0, 2, (300, 10, 10, 4)).astype(np.float32)

    def reach(m):
        hidden = tf_keras.Model(m.inputs, m.get_layer("hidden_0").output)(states).numpy().max(axis=0)
        return hidden[hidden > 0]

    before = reach(model)
    assert before.min() < before.max() / 20
    equalized = equalize_head_input(model, states)
    np.testing.assert_allclose(reach(equalized), before.max(), rtol=1e-5)
    np.testing.assert_allclose(q_from_outputs(equalized(states)).numpy(), q_from_outputs(model(states)).numpy(),
                               rtol=1e-4, atol=1e-4)
    tanh = split_value_advantage(tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(8, activation="tanh"),
                                                      tf_keras.layers.Dense(2, name="q_values")]))
    assert equalize_head_input(tanh, states[:, 0, 0, :]) is tanh  # tanh(s z) != s tanh(z): nothing to do
    with pytest.raises(ValueError, match="equalize needs float_head"):
        QuantizeConfig(mode="qat", equalize=True)
    rung = VariantConfig(name="x", prune={"sparsity": 0.95},
                         quantize={"mode": "qat", "float_head": True, "equalize": True})
    assert variant_name(rung) == "prune-95-qat-int8-float-heads-eq"  # a search keys its builds by this name


def test_weight_only_stores_every_kernel_in_int8_and_computes_in_float(trained_tiny, tmp_path):
    """weight_only: every kernel int8 with a scale per unit, the output layers' float16, each behind a DEQUANTIZE;
    the file is smaller than dynamic range's (which keeps kernels under 1,024 weights in float32: all of these),
    plays the float model's actions, and the C and ONNX exports read its widened kernels."""
    import gzip

    from compress_dqn.deploy.tflite.file import TFLiteFile
    from compress_dqn.deploy.tflite.graph import read_policy_graph

    path, built = tflite_for(trained_tiny, tmp_path / "weight-only", quantize={"mode": "weight_only"})
    dynamic, _ = tflite_for(trained_tiny, tmp_path / "dynamic", quantize={"mode": "dynamic"})
    model = TFLiteFile.read(path)
    schema, graph = model.schema, model.graph
    kinds = {int(op.outputs[0]): (model.builtin(op), [graph.tensors[int(i)] for i in op.inputs]) for op in graph.operators}
    layers = [op for op in graph.operators if model.builtin(op) == schema.BuiltinOperator.FULLY_CONNECTED]
    stored = []
    for op in layers:
        kind, (constant,) = kinds[int(op.inputs[1])]  # the kernel is computed, by a DEQUANTIZE of one constant
        assert kind == schema.BuiltinOperator.DEQUANTIZE and graph.tensors[int(op.inputs[1])].type == schema.TensorType.FLOAT32
        stored.append(constant.type)
        if constant.type == schema.TensorType.INT8:
            assert len(constant.quantization.scale) == constant.shape[0] and not np.any(constant.quantization.zeroPoint)
    assert stored.count(schema.TensorType.FLOAT16) == 2 and stored.count(schema.TensorType.INT8) == len(layers) - 2
    kernel_bytes = sum(len(model.model.buffers[t.buffer].data) for t in graph.tensors
                       if t.type in (schema.TensorType.INT8, schema.TensorType.FLOAT16) and t.buffer)
    weights = sum(k.size for k in dense_kernels(built.export_model).values())
    assert kernel_bytes < 1.3 * weights  # a byte a weight (two in the small output layers), not float32's four
    assert len(gzip.compress(path.read_bytes())) < len(gzip.compress(dynamic.read_bytes()))
    assert agreement(path, trained_tiny) > 0.95
    _, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(200)).observations
    q = TFLitePolicy(path).q_values(obs)
    assert np.allclose(q, result.model(obs).numpy(), atol=0.02 * np.abs(q).max())  # float arithmetic on rounded weights
    read = read_policy_graph(path)
    assert [op.kind for op in read.ops].count("FULLY_CONNECTED") == len(layers)
    assert all(op.inputs[1].value is not None and op.inputs[1].value.dtype == np.float32
               for op in read.ops if op.kind == "FULLY_CONNECTED")
