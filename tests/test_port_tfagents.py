"""TF-Agents DQN policies (PolicySaver SavedModels) port from their variables; C51, RNN and preprocessing refused.

The fixture (tests/data/port/tfagents) was made by benchmarks/tfagents_dqn.py --fixture in its own
venv (TensorFlow 2.15, tf-agents 0.19): an untrained QNetwork(fc_layer_params=(8,)) saved with
PolicySaver, with CartPole states and the actions its `action` signature took on them there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.errors import UserError
from compress_dqn.port.baseline import load_model
from compress_dqn.port.check import cross_check

FIXTURE = Path(__file__).resolve().parent / "data" / "port" / "tfagents"
CARTPOLE = SimpleNamespace(env_id="CartPole-v1", obs_shape=(4,), obs_dtype=np.dtype(np.float32), n_actions=2, frame_stack=1)


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((FIXTURE / "expected.json").read_text())


def test_a_policy_saver_directory_ports_and_agrees_with_its_action_signature(expected):
    states = np.asarray(expected["states"], dtype=np.float32)
    model = load_model(FIXTURE, CARTPOLE)
    # The actions TF-Agents' own SavedModel took under TensorFlow 2.15, recorded by the benchmark script.
    assert (model.predict(states, verbose=0).argmax(axis=1) == np.asarray(expected["actions"])).all()
    assert len(set(expected["actions"])) == 2  # both actions occur: agreement is not one constant
    record = cross_check(FIXTURE, model, states, CARTPOLE)
    assert record.checked and record.action_agreement == 1.0, record
    assert record.max_abs_q_diff is None and any("not measurable" in note for note in record.notes)
    assert "action signature" in record.runtime and "not measurable" in record.summary()


def _never_loaded(monkeypatch):
    """Loading or running the SavedModel fails the test: the refusals come from its data alone."""
    import tensorflow as tf

    def refuse(*_args, **_kwargs):
        raise AssertionError("the SavedModel was loaded")

    monkeypatch.setattr(tf.saved_model, "load", refuse)
    monkeypatch.setattr(tf.compat.v1.saved_model, "load", refuse)


def _with_variables(tmp_path: Path, names: list[str]) -> Path:
    """The fixture with its checkpoint replaced by model variables of the given names."""
    import tensorflow as tf

    path = tmp_path / "policy"
    shutil.copytree(FIXTURE, path)
    shutil.rmtree(path / "variables")
    variables = [tf.Variable(np.zeros((4, 2) if name.endswith("kernel") else (2,), np.float32), name=name) for name in names]
    tf.train.Checkpoint(model_variables=variables).write(str(path / "variables" / "variables"))
    return path


@pytest.mark.parametrize("names, said", [
    (["CategoricalQNetwork/CategoricalQNetwork/EncodingNetwork/dense/kernel",
      "CategoricalQNetwork/CategoricalQNetwork/dense_1/kernel"], "C51"),
    (["QRnnNetwork/EncodingNetwork/dense/kernel", "QRnnNetwork/dynamic_unroll/kernel"], "recurrent"),
    (["ActorDistributionNetwork/dense/kernel"], "ActorDistributionNetwork"),
])
def test_other_networks_are_refused_by_name_without_loading_the_model(tmp_path, monkeypatch, names, said):
    path = _with_variables(tmp_path, names)
    _never_loaded(monkeypatch)
    with pytest.raises(UserError) as caught:
        load_model(path, CARTPOLE)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_policy_state_and_a_preprocessing_layer_are_refused(tmp_path, monkeypatch):
    from tensorflow.core.protobuf import saved_model_pb2

    _never_loaded(monkeypatch)
    rnn = tmp_path / "rnn"
    shutil.copytree(FIXTURE, rnn)
    specs = (rnn / "policy_specs.pbtxt").read_text()
    state = 'key: "policy_state_spec"\n    value {\n      tuple_value {\n      }'
    assert state in specs
    (rnn / "policy_specs.pbtxt").write_text(specs.replace(state, state.replace(
        "tuple_value {\n      }", 'list_value { values { tensor_spec_value { name: "network_state_0" dtype: DT_FLOAT } } }')))
    with pytest.raises(UserError, match="recurrent policy"):
        load_model(rnn, CARTPOLE)
    lam = tmp_path / "lambda"
    shutil.copytree(FIXTURE, lam)
    model = saved_model_pb2.SavedModel()
    model.ParseFromString((lam / "saved_model.pb").read_bytes())
    node = model.meta_graphs[0].graph_def.library.function[0].node_def.add()
    node.name, node.op = "QNetwork/EncodingNetwork/lambda/truediv", "RealDiv"
    (lam / "saved_model.pb").write_bytes(model.SerializeToString())
    with pytest.raises(UserError, match=r"QNetwork/EncodingNetwork/lambda is a preprocessing layer"):
        load_model(lam, CARTPOLE)


def test_a_directory_of_no_known_layout_says_what_it_is_not(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(UserError) as caught:
        load_model(tmp_path, CARTPOLE)
    message = str(caught.value)
    assert "no SavedModel" in message and "TF-Agents" in message and "RLlib" in message and "run" in message
    assert "must be a Keras one" not in message and "\n" not in message
