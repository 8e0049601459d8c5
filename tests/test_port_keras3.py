"""Keras 3 files (.keras and .h5, as `tf.keras` saves them since TensorFlow 2.16) port with Keras 3's own Q-values.

Each model is a few units wide and made here by Keras 3 itself; the port is checked against Keras 3's
forward pass of the saved file. What must not come in (a Lambda, a custom class, a layer outside the
allow-list, a model.export() SavedModel) is refused in one line, before any Keras loader runs.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.errors import UserError
from compress_dqn.port.baseline import load_model
from compress_dqn.port.check import cross_check
from compress_dqn.port.load import file_kind

keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3."):
    pytest.skip("Keras 3 is not installed", allow_module_level=True)
L = keras.layers

pytestmark = pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")  # the .h5 is the point

CARTPOLE = SimpleNamespace(env_id="CartPole-v1", obs_shape=(4,), obs_dtype=np.dtype(np.float32), n_actions=2, frame_stack=1)
FRAMES = SimpleNamespace(env_id="Frames", obs_shape=(12, 12, 2), obs_dtype=np.dtype(np.uint8), n_actions=3, frame_stack=2)
RNG = np.random.default_rng(0)
FLAT_STATES = (RNG.normal(size=(256, 4)) * [1.0, 0.5, 0.1, 0.5]).astype(np.float32)
FRAME_STATES = RNG.integers(0, 256, size=(64, 12, 12, 2)).astype(np.uint8)


def _randomize_batch_norms(model) -> None:
    """Statistics a trained BatchNormalization would have (fresh ones are the identity: nothing to check)."""
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            n = layer.gamma.shape[0]
            layer.set_weights([RNG.uniform(0.5, 2, n), RNG.normal(size=n), RNG.normal(size=n), RNG.uniform(0.5, 2, n)])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Tiny Keras 3 Q-networks, each saved in the formats the test reads."""
    folder = tmp_path_factory.mktemp("keras3")
    keras.utils.set_random_seed(0)
    mlp = keras.Sequential([keras.Input((4,)), L.Dense(8, activation="relu"), L.Dense(8, activation="relu"), L.Dense(2)])
    mlp.save(folder / "mlp.keras")
    mlp.save(folder / "mlp.h5")
    norm = L.Normalization(axis=-1)
    norm.adapt(RNG.uniform(0, 255, size=(64, 12, 12, 2)).astype(np.float32))
    cnn = keras.Sequential([keras.Input((2, 12, 12)), L.Permute((2, 3, 1)), L.Rescaling(1 / 255, offset=-0.5), norm,
                            L.Conv2D(4, 4, strides=2), L.BatchNormalization(), L.ReLU(),
                            L.Conv2D(4, 3, activation="relu"), L.BatchNormalization(), L.Flatten(),
                            L.Dense(8, activation="tanh"), L.Dropout(0.5), L.Dense(3)])
    _randomize_batch_norms(cnn)
    cnn.save(folder / "cnn.keras")
    cnn.save(folder / "cnn.h5")
    nature = keras.Sequential([keras.Input((12, 12, 2)), L.Rescaling(1 / 255), L.Conv2D(4, 4, strides=2, activation="relu"),
                               L.Conv2D(4, 3, activation="relu"), L.Flatten(), L.Dense(8, activation="relu"), L.Dense(3)])
    nature.save(folder / "nature.keras")
    inputs = keras.Input((4,))
    x = L.Normalization(mean=[0.1, -0.2, 0.0, 0.3], variance=[1.0, 0.25, 0.01, 4.0])(inputs)
    x = L.Activation("relu")(L.BatchNormalization()(L.Dense(8)(x)))
    advantage, value = L.Dense(2)(x), L.Dense(1)(x)
    q = L.Add()([value, L.Subtract()([advantage, keras.ops.mean(advantage, axis=1, keepdims=True)])])
    dueling = keras.Model(inputs, q)
    _randomize_batch_norms(dueling)
    dueling.save(folder / "dueling.keras")
    return {path.name: path for path in folder.iterdir()}


def assert_exact(path: Path, info: SimpleNamespace, states: np.ndarray):
    assert file_kind(path) == "keras3"
    model = load_model(path, info)
    record = cross_check(path, model, states, info)
    assert record.checked and record.runtime.startswith("keras 3."), record
    assert record.max_abs_q_diff <= 1e-4 and record.action_agreement == 1.0, record
    return model, record


@pytest.mark.parametrize("name", ["mlp.keras", "mlp.h5"])
def test_a_keras3_mlp_ports_exactly_from_either_format(files, name):
    _, record = assert_exact(files[name], CARTPOLE, FLAT_STATES)
    assert record.format == f"a Keras 3 .{name.split('.')[1]} file"


@pytest.mark.parametrize("name", ["cnn.keras", "cnn.h5"])
def test_input_normalization_batch_norm_and_a_channel_permute_fold_exactly(files, name):
    model, record = assert_exact(files[name], FRAMES, FRAME_STATES)
    assert [type(layer).__name__ for layer in model.layers] == ["Conv2D", "Conv2D", "Flatten", "Dense", "Dense"]
    assert any("Permute" in note for note in record.notes)
    assert any(note.startswith("rescaling, normalization folded into conv2d") for note in record.notes), record.notes


def test_a_channel_last_cnn_keeps_its_input_rescaling_in_front(files):
    model, _ = assert_exact(files["nature.keras"], FRAMES, FRAME_STATES)
    first = model.layers[0]
    assert type(first).__name__ == "Rescaling" and first.scale == pytest.approx(1 / 255)


def test_a_dueling_head_and_flat_normalization_fold_into_dense_layers(files):
    model, record = assert_exact(files["dueling.keras"], CARTPOLE, FLAT_STATES)
    assert [type(layer).__name__ for layer in model.layers] == ["Dense", "Dense"]
    assert any("dueling head" in note for note in record.notes)


def test_a_wrong_environment_or_an_export_directory_is_refused_in_one_line(files, tmp_path):
    with pytest.raises(UserError, match=r"input shape is \(4,\) but the environment's observations are \(12, 12, 2\)"):
        load_model(files["mlp.keras"], FRAMES)
    model = keras.models.load_model(files["mlp.keras"])
    model.export(str(tmp_path / "exported"), verbose=False)
    with pytest.raises(UserError, match=r"Keras 3's model.export\(\).*model.save\('q.keras'\)"):
        load_model(tmp_path / "exported", CARTPOLE)


@keras.saving.register_keras_serializable(package="evil")
class Touch(L.Layer):
    """A custom layer whose code writes the sentinel: defined here, so Keras could build it if it loaded the file."""

    def __init__(self, marker: str = "", **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def call(self, x):
        Path(self.marker).write_text("ran")
        return x

    def get_config(self):
        return {**super().get_config(), "marker": self.marker}


@keras.saving.register_keras_serializable(package="evil")
class TouchModel(keras.Model):
    """A subclassed Q-network whose forward pass writes the sentinel."""

    def __init__(self, marker: str = "", **kwargs):
        super().__init__(**kwargs)
        self.marker, self.dense = marker, L.Dense(2)

    def call(self, x):
        Path(self.marker).write_text("ran")
        return self.dense(x)

    def get_config(self):
        return {"marker": self.marker}


def _edited(source: Path, target: Path, edit) -> Path:
    """A copy of a .keras zip whose config.json went through edit(config)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config).encode()
            new.writestr(item, data)
    return target


def test_code_in_a_file_is_refused_by_name_and_never_runs(files, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("COMPRESS_DQN_TEST_MARKER", str(marker))
    touch = L.Lambda(lambda t: (open(__import__("os").environ["COMPRESS_DQN_TEST_MARKER"], "w").close(), t)[1],
                     name="transpose")
    with_lambda = keras.Sequential([keras.Input((4,)), touch, L.Dense(2)])
    with_custom = keras.Sequential([keras.Input((4,)), Touch(str(marker), name="touch"), L.Dense(2)])
    subclassed = TouchModel(str(marker))
    subclassed(FLAT_STATES[:1])
    subclassed.save(tmp_path / "subclassed.keras")
    for model, stem in [(with_lambda, "lambda"), (with_custom, "custom")]:
        model.save(tmp_path / f"{stem}.keras")
        model.save(tmp_path / f"{stem}.h5")
    outside = _edited(files["mlp.keras"], tmp_path / "outside.keras",
                      lambda c: c["config"]["layers"][1].update(class_name="LSTM"))
    foreign = _edited(files["mlp.keras"], tmp_path / "foreign.keras",
                      lambda c: c["config"]["layers"][1]["config"].update(kernel_initializer={
                          "module": "os", "class_name": "system", "config": {}, "registered_name": None}))
    marker.unlink()  # building the models ran their code once
    cases = [("lambda.keras", "layer transpose is a Lambda.*Permute\\(\\(2, 3, 1\\)\\)"),
             ("lambda.h5", "layer transpose is a Lambda"),
             ("custom.keras", "layer touch is a custom object \\(evil>Touch\\)"),
             ("custom.h5", "layer touch is a custom object"),
             ("subclassed.keras", "the model is a TouchModel \\(a subclassed model's forward pass is Python code"),
             (outside.name, "layer dense\\w* is a LSTM, which is not ported"),
             (foreign.name, "layer dense\\w* names os.system, which is not a Keras built-in")]
    for name, fragment in cases:
        with pytest.raises(UserError, match=fragment) as caught:
            cross_check(tmp_path / name, None, FLAT_STATES, CARTPOLE)
        assert "\n" not in str(caught.value)
        with pytest.raises(UserError, match=fragment):
            load_model(tmp_path / name, CARTPOLE)
        assert not marker.exists(), f"reading {name} ran its code"


@pytest.mark.parametrize("layer, fragment", [
    (L.Conv2D(2, 3, padding="same"), "only valid-padding"),
    (L.Dense(8, activation="elu"), "activation 'elu'; ported activations: relu, tanh, linear"),
])
def test_a_layer_setting_the_port_cannot_carry_is_named(tmp_path, layer, fragment):
    shape = (12, 12, 2) if isinstance(layer, L.Conv2D) else (4,)
    model = keras.Sequential([keras.Input(shape), layer, L.Flatten(), L.Dense(3 if len(shape) == 3 else 2)])
    model.save(tmp_path / "q.keras")
    with pytest.raises(UserError, match=fragment):
        load_model(tmp_path / "q.keras", FRAMES if len(shape) == 3 else CARTPOLE)
