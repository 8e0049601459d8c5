"""Policies from Stable-Baselines3, CleanRL and ONNX: each ports to tf_keras with the source's own Q-values.

Fixtures are made by the real libraries (tests/data/make_port_fixtures.py); the CNN ones, too large
to commit, are made here by the same functions. Every port is compared with the source's runtime
(SB3's QNetwork on torch, torch, onnxruntime) on real or space-sampled observations.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import PortCheck
from compress_dqn.port.baseline import load_model
from compress_dqn.port.check import cross_check

DATA = Path(__file__).resolve().parent / "data"
PORT = DATA / "port"
sys.path.insert(0, str(DATA))
import make_port_fixtures as fixtures

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")

CARTPOLE = SimpleNamespace(env_id="CartPole-v1", obs_shape=(4,), obs_dtype=np.dtype(np.float32), n_actions=2, frame_stack=1)


@pytest.fixture(scope="module")
def cartpole_states() -> np.ndarray:
    """States a CartPole policy visits: random-action episodes."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    states = []
    for _ in range(400):
        states.append(obs)
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        if terminated or truncated:
            obs, _ = env.reset()
    return np.asarray(states, dtype=np.float32)


def assert_exact(path: Path, info: SimpleNamespace, states: np.ndarray) -> PortCheck:
    model = load_model(path, info)
    record = cross_check(path, model, states, info)
    assert record.checked, record
    assert record.max_abs_q_diff <= 1e-4 and record.action_agreement == 1.0, record
    assert record.states == len(states)
    return record


@pytest.mark.parametrize("name", ["sb3_cartpole.zip", "sb3_cartpole_tanh.zip", "vecnorm/sb3_cartpole_vecnorm.zip",
                                  "cleanrl_cartpole.cleanrl_model", "sb3_cartpole.onnx"])
def test_each_format_ports_exactly(name, cartpole_states):
    record = assert_exact(PORT / name, CARTPOLE, cartpole_states)
    runtime = {"zip": "stable-baselines3", "cleanrl_model": "torch", "onnx": "onnxruntime"}[name.rsplit(".", 1)[1]]
    assert runtime in record.runtime


def test_vecnormalize_statistics_are_folded_in_not_ignored(cartpole_states, tmp_path):
    path = PORT / "vecnorm" / "sb3_cartpole_vecnorm.zip"
    record = assert_exact(path, CARTPOLE, cartpole_states)
    assert any("VecNormalize" in note for note in record.notes)
    # The same zip without its statistics is a different policy: the check would show it.
    alone = tmp_path / path.name
    alone.write_bytes(path.read_bytes())
    with_stats, without = load_model(path, CARTPOLE), load_model(alone, CARTPOLE)
    assert np.abs(with_stats.predict(cartpole_states, verbose=0) - without.predict(cartpole_states, verbose=0)).max() > 0.1


def test_sb3_cnn_policy_takes_the_environments_channel_last_frames(tmp_path):
    path = tmp_path / "cnn.zip"
    fixtures.sb3_cnn(path, shape=(44, 44, 2), n_actions=3)  # 2x2 after the convolutions: the flatten order matters
    info = SimpleNamespace(env_id="Frames", obs_shape=(44, 44, 2), obs_dtype=np.dtype(np.uint8), n_actions=3, frame_stack=1)
    frames = np.random.default_rng(0).integers(0, 256, (64, 44, 44, 2), dtype=np.uint8)
    record = assert_exact(path, info, frames)
    assert any("1/255" in note for note in record.notes) and any("channel" in note for note in record.notes)


def test_cleanrl_atari_network_and_its_onnx_export(tmp_path):
    import torch

    path = tmp_path / "dqn_atari.cleanrl_model"
    fixtures.cleanrl_cnn(path, channels=4, n_actions=4, hidden=32)
    info = SimpleNamespace(env_id="ALE/Pong-v5", obs_shape=(84, 84, 4), obs_dtype=np.dtype(np.uint8), n_actions=4, frame_stack=4)
    frames = np.random.default_rng(1).integers(0, 256, (32, 84, 84, 4), dtype=np.uint8)
    assert_exact(path, info, frames)
    # The same network exported to ONNX, with CleanRL's x / 255 in the graph.
    state = torch.load(path, weights_only=True)
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 32, 8, 4), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 4, 2), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 64, 3, 1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3136, 32),
                              torch.nn.ReLU(), torch.nn.Linear(32, 4))
    net.load_state_dict({k.removeprefix("network."): v for k, v in state.items()})

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = net

        def forward(self, x):
            return self.network(x / 255.0)

    onnx_path = tmp_path / "dqn_atari.onnx"
    torch.onnx.export(Scaled().eval(), torch.zeros(1, 4, 84, 84), str(onnx_path), input_names=["obs"],
                      dynamic_axes={"obs": {0: "batch"}}, dynamo=False)
    assert_exact(onnx_path, info, frames)


def test_a_state_dict_layer_that_cannot_be_inferred_is_named(tmp_path):
    import torch

    strided = tmp_path / "odd.pt"
    torch.save({"network.0.weight": torch.zeros(8, 4, 5, 5), "network.0.bias": torch.zeros(8),
                "network.3.weight": torch.zeros(2, 8)}, strided)
    info = SimpleNamespace(env_id="x", obs_shape=(20, 20, 4), obs_dtype=np.dtype(np.uint8), n_actions=2, frame_stack=4)
    with pytest.raises(UserError, match=r"cannot infer the stride of Conv2d network\.0 \(5x5 kernel.*ONNX"):
        load_model(strided, info)
    normed = tmp_path / "bn.pt"
    torch.save({"fc.weight": torch.zeros(8, 4), "fc.bias": torch.zeros(8), "bn.running_mean": torch.zeros(8),
                "out.weight": torch.zeros(2, 8)}, normed)
    with pytest.raises(UserError, match=r"cannot infer a Linear or Conv2d layer from bn\.running_mean"):
        load_model(normed, CARTPOLE)


def test_an_unsupported_onnx_op_is_named(tmp_path):
    import torch

    path = tmp_path / "sigmoid.onnx"
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 2))
    torch.onnx.export(net, torch.zeros(1, 4), str(path), dynamo=False)
    with pytest.raises(UserError, match=r"op Sigmoid .* is not ported"):
        load_model(path, CARTPOLE)


def test_a_wrong_environment_is_refused_in_one_line():
    lunar = SimpleNamespace(env_id="LunarLander-v3", obs_shape=(8,), obs_dtype=np.dtype(np.float32), n_actions=4, frame_stack=1)
    for name in ("sb3_cartpole.zip", "cleanrl_cartpole.cleanrl_model", "sb3_cartpole.onnx"):
        with pytest.raises(UserError) as caught:
            load_model(PORT / name, lunar)
        assert "\n" not in str(caught.value) and str(PORT / name) in str(caught.value)


def test_a_missing_runtime_says_the_port_was_not_cross_checked(monkeypatch, cartpole_states):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "onnxruntime") else real(name, *a))
    for name, extra in (("sb3_cartpole.zip", "sb3"), ("cleanrl_cartpole.cleanrl_model", "torch"), ("sb3_cartpole.onnx", "onnx")):
        model = load_model(PORT / name, CARTPOLE)  # reading needs none of the runtimes
        record = cross_check(PORT / name, model, cartpole_states, CARTPOLE)
        assert record.checked is False and "not cross-checked" in record.reason
        assert f"compress-dqn[{extra}]" in record.reason


def test_reading_onnx_without_the_onnx_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    with pytest.raises(UserError, match=r"pip install 'compress-dqn\[onnx\]'"):
        load_model(PORT / "sb3_cartpole.onnx", CARTPOLE)


@pytest.mark.parametrize("name", ["sb3_cartpole.zip", "cleanrl_cartpole.cleanrl_model", "sb3_cartpole.onnx"])
def test_the_check_catches_a_wrong_port(name, cartpole_states):
    """The check compares with the source, not with the port: a port off by one weight shows."""
    model = load_model(PORT / name, CARTPOLE)
    kernel, bias = model.layers[0].get_weights()
    kernel[0, 0] += 1.0
    model.layers[0].set_weights([kernel, bias])
    record = cross_check(PORT / name, model, cartpole_states, CARTPOLE)
    assert record.checked and record.max_abs_q_diff > 1e-3


def test_damaged_or_foreign_files_are_refused_in_one_line(tmp_path):
    truncated = tmp_path / "dqn.zip"
    truncated.write_bytes((PORT / "sb3_cartpole.zip").read_bytes()[:-200])
    plain_zip = tmp_path / "other.zip"
    with __import__("zipfile").ZipFile(plain_zip, "w") as archive:
        archive.writestr("readme.txt", "not a policy")
    garbage = tmp_path / "q.onnx"
    garbage.write_bytes(b"\x00\x01garbage" * 10)
    legacy = tmp_path / "old.pth"
    legacy.write_bytes(b"\x80\x02" + b"\x00" * 30)
    for path, fragment in ((truncated, "without SB3's data and policy.pth entries .or a damaged one"), (plain_zip, "without SB3's data and policy.pth"),
                           (garbage, "not an ONNX model"), (legacy, "legacy")):
        with pytest.raises(UserError, match=fragment) as caught:
            load_model(path, CARTPOLE)
        assert "\n" not in str(caught.value)


def test_results_read_the_port_check_and_old_results_have_none():
    from compress_dqn.evaluation.results import RunResults

    base = json.loads((Path(__file__).parent / "data" / "legacy-a0e684b" / "run" / "results.json").read_text())
    assert RunResults.from_dict({**base, "train": {"env_steps": 10}}).port_check is None  # a trained baseline
    record = {"format": "an ONNX model", "checked": False, "states": 512, "notes": [],
              "reason": "not cross-checked: onnxruntime is not installed (pip install 'compress-dqn[onnx]' to ...)"}
    loaded = RunResults.from_dict({**base, "train": {"port_check": record}})
    assert loaded.port_check.summary() == f"Port from an ONNX model: {record['reason']}."
    assert loaded.to_dict()["train"] == {"port_check": record}  # written back as it was read


def test_an_onnx_bias_after_an_activation_is_refused_and_a_row_bias_is_read(tmp_path):
    """Add(c) after a Relu is not a bias of the MatMul before it (taken as one, it shifts the ReLU's
    input); a Gemm bias of shape (1, N), valid ONNX broadcasting, is that layer's bias."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from compress_dqn.port.onnx_net import read_onnx

    w1, w2 = np.ones((4, 8), np.float32), np.ones((8, 2), np.float32)

    def save(nodes, inits, name):
        graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 2])],
                                  [numpy_helper.from_array(v, k) for k, v in inits.items()])
        path = tmp_path / name
        onnx.save(helper.make_model(graph), path)
        return path

    after = save([helper.make_node("MatMul", ["obs", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                  helper.make_node("Add", ["r", "c"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["q"])],
                 {"w1": w1, "w2": w2, "c": np.ones(8, np.float32)}, "after.onnx")
    with pytest.raises(UserError, match="before its activation"):
        read_onnx(after, after.read_bytes(), (4,))
    row = save([helper.make_node("Gemm", ["obs", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("MatMul", ["r", "w2"], ["q"])],
               {"w1": w1, "w2": w2, "b1": np.full((1, 8), 0.5, np.float32)}, "row.onnx")
    net, _ = read_onnx(row, row.read_bytes(), (4,))
    np.testing.assert_array_equal(net.layers[0].bias, np.full(8, 0.5, np.float32))
