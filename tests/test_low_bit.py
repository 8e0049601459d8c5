"""compress.low_bit: kernels at 2-7 bits through QAT, stored exactly in the TFLite file."""

import numpy as np
import pytest

from compress_dqn.compress.build import build_variant
from compress_dqn.convert.conversion import convert_policy

from conftest import variant


def test_a_low_bit_kernel_is_stored_exactly_at_its_bit_width_and_plays_as_trained(tmp_path):
    """quantize.kernel_bits: the QAT file stores the layer's kernel with a scale per unit and exactly
    the 2^b-1 integers QAT trained (under 4 bits too, where the converter's own grid is 4 bits), and
    LiteRT's Q-values match the fake-quantized model's."""
    from ai_edge_litert.interpreter import Interpreter

    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import calibrate_ranges, converter_setup, qat_model
    from compress_dqn.compress.rewrites import flattened_dense_as_conv, split_value_advantage
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig
    from compress_dqn.rl.networks import q_from_outputs

    tf_keras.utils.set_random_seed(0)
    model = flattened_dense_as_conv(split_value_advantage(tf_keras.Sequential([
        tf_keras.Input((10, 10, 4)), tf_keras.layers.Conv2D(4, 3, activation="relu", name="conv_0"),
        tf_keras.layers.Flatten(name="flatten"), tf_keras.layers.Dense(16, activation="relu", name="hidden_0"),
        tf_keras.layers.Dense(3, name="q_values")])))
    states = np.random.default_rng(0).integers(0, 2, (300, 10, 10, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="no layer named hidden_9 for kernel_bits"):
        qat_model(model, kernel_bits={"hidden_9": 4})
    for bits in (3, 5):
        qat = qat_model(model, kernel_bits={"hidden_0": bits})
        calibrate_ranges(qat, model, states)
        saved = export_saved_model(qat, (10, 10, 4), np.float32, tmp_path / f"saved_model{bits}")
        path = tmp_path / f"qat{bits}.tflite"
        path.write_bytes(convert_tflite(saved, converter_setup(QuantizeConfig(mode="qat", kernel_bits={"hidden_0": bits}))))
        interp = Interpreter(model_path=str(path), experimental_preserve_all_tensors=True)
        interp.allocate_tensors()
        kernels = {tuple(t["shape"]): t for t in interp.get_tensor_details() if np.dtype(t["dtype"]) == np.int8}
        hidden = interp.get_tensor(kernels[(16, 8, 8, 4)]["index"])
        assert len(kernels[(16, 8, 8, 4)]["quantization_parameters"]["scales"]) == 16
        top = 2 ** (bits - 1) - 1
        assert set(np.unique(hidden)) == set(range(-top, top + 1)), bits
        conv = interp.get_tensor(kernels[(4, 3, 3, 4)]["index"])
        assert np.abs(conv).max() == 127  # the layers not named keep 8 bits
        runner = interp.get_signature_runner()
        (name,) = runner.get_input_details()
        played = [runner(**{name: s[None]}) for s in states[:50]]
        q_values = np.concatenate([p["q_values"] for p in played])
        expected = q_from_outputs(qat(states[:50], training=False)).numpy()
        np.testing.assert_allclose(q_values, expected, atol=0.02 * np.abs(expected).max())
        assert np.array_equal(np.concatenate([p["action"] for p in played]), q_values.argmax(1))

def test_a_students_low_bit_dense_kernel_reaches_its_file(trained_tiny, tmp_path):
    """A variant's quantize.kernel_bits reaches the build: an MLP student's Dense kernel (one scale,
    tfmot's Dense config) is exported within 3 bits, the next layer at 8."""
    from ai_edge_litert.interpreter import Interpreter

    recipe, result = trained_tiny
    v = variant(recipe, student={"net_arch": [16, 16]}, fine_tune={"steps": 60},
                quantize={"mode": "qat", "qat_steps": 20, "kernel_bits": {"hidden_0": 3}})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    convert_policy(built.export_model, result.info, tmp_path, built, result.replay.sample_observations(100))
    interp = Interpreter(model_path=str(tmp_path / "policy.tflite"))
    interp.allocate_tensors()
    kernels = {tuple(t["shape"]): interp.get_tensor(t["index"]) for t in interp.get_tensor_details()
               if np.dtype(t["dtype"]) == np.int8 and len(t["shape"]) == 2 and t["shape"][0] > 1}
    assert set(np.unique(kernels[(16, 4)])) <= set(range(-3, 4)) and len(np.unique(kernels[(16, 4)])) > 3
    assert np.abs(kernels[(16, 16)]).max() == 127
