"""Every SB3 zip layout (2.x `_shape`, 1.x `shape`, "1.0": no readable fields, only the pickled gym spaces), DQN and
QR-DQN, MlpPolicy and CnnPolicy, ports exactly: checked against SB3's / sb3-contrib's own forward pass.

The zips are made here by the real libraries (tests/data/make_port_fixtures.py), tiny and untrained,
then rewritten into the older layouts; no downloaded file is read.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.errors import UserError
from compress_dqn.port.baseline import load_model
from compress_dqn.port.check import cross_check

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import make_port_fixtures as fixtures

CARTPOLE = SimpleNamespace(env_id="CartPole-v1", obs_shape=(4,), obs_dtype=np.dtype(np.float32), n_actions=2, frame_stack=1)
FRAMES = SimpleNamespace(env_id="Frames", obs_shape=(36, 36, 2), obs_dtype=np.dtype(np.uint8), n_actions=3, frame_stack=1)
LAYOUTS = ("2.x", "1.x", "1.0")


@pytest.fixture(scope="module")
def zips(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(algorithm, policy) -> an SB3 2.x zip: DQN and QR-DQN, MlpPolicy (CartPole) and CnnPolicy (36x36x2 frames)."""
    root = tmp_path_factory.mktemp("sb3")
    made = {("DQN", "Mlp"): root / "dqn_mlp.zip", ("DQN", "Cnn"): root / "dqn_cnn.zip",
            ("QR-DQN", "Mlp"): root / "qrdqn_mlp.zip", ("QR-DQN", "Cnn"): root / "qrdqn_cnn.zip"}
    fixtures.sb3_mlp(made["DQN", "Mlp"], [16, 16], steps=0)
    fixtures.sb3_cnn(made["DQN", "Cnn"], shape=(36, 36, 2), n_actions=3)
    fixtures.qrdqn(made["QR-DQN", "Mlp"], n_quantiles=7)
    fixtures.qrdqn(made["QR-DQN", "Cnn"], "CnnPolicy", n_quantiles=5, shape=(36, 36, 2), n_actions=3)
    return made


def in_layout(source: Path, layout: str, tmp_path: Path) -> Path:
    if layout == "2.x":
        return source
    path = tmp_path / f"{layout}-{source.name}"
    fixtures.as_layout(source, path, layout)
    return path


def states(info: SimpleNamespace) -> np.ndarray:
    rng = np.random.default_rng(0)
    if info.obs_dtype == np.uint8:
        return rng.integers(0, 256, (32, *info.obs_shape), dtype=np.uint8)
    return rng.normal(scale=[1.0, 2.0, 0.2, 2.0], size=(256, 4)).astype(np.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm,policy", [("DQN", "Mlp"), ("QR-DQN", "Mlp"), ("DQN", "Cnn"), ("QR-DQN", "Cnn")])
def test_each_layout_and_algorithm_ports_exactly(zips, tmp_path, layout, algorithm, policy):
    path = in_layout(zips[algorithm, policy], layout, tmp_path)
    info = CARTPOLE if policy == "Mlp" else FRAMES
    model = load_model(path, info)
    record = cross_check(path, model, states(info), info)
    assert record.checked and record.max_abs_q_diff <= 1e-5 and record.action_agreement == 1.0, record
    assert ("sb3-contrib" in record.runtime) == (algorithm == "QR-DQN")
    assert any("QR-DQN" in note for note in record.notes) == (algorithm == "QR-DQN")
    assert any("pickled gym spaces" in note for note in record.notes) == (layout == "1.0")


def test_the_qrdqn_fold_is_the_mean_over_quantiles_of_sb3_contribs_layout(zips):
    """sb3-contrib views the last layer's outputs as (n_quantiles, n_actions); the other order would differ."""
    import torch
    from sb3_contrib import QRDQN

    path = zips["QR-DQN", "Mlp"]
    model = QRDQN.load(path, device="cpu")  # our own fixture: its pickles are trusted here
    obs = states(CARTPOLE)
    with torch.no_grad():
        quantiles = model.policy.quantile_net(torch.as_tensor(obs)).numpy()
    assert quantiles.shape == (len(obs), 7, 2)
    ported = load_model(path, CARTPOLE).predict(obs, verbose=0)
    np.testing.assert_allclose(ported, quantiles.mean(axis=1), atol=1e-5)
    np.testing.assert_array_equal(ported.argmax(axis=1), model.predict(obs, deterministic=True)[0])
    wrong = quantiles.reshape(len(obs), 2, 7).mean(axis=2)  # (n_actions, n_quantiles): not sb3-contrib's layout
    assert np.abs(ported - wrong).max() > 1e-3


def test_the_saved_spaces_are_checked_against_the_first_layer_and_the_environment(zips, tmp_path):
    path = in_layout(zips["DQN", "Mlp"], "1.x", tmp_path)
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    data["observation_space"]["shape"] = [6]
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(edited, "w") as archive:
        for name, content in {**entries, "data": json.dumps(data).encode()}.items():
            archive.writestr(name, content)
    with pytest.raises(UserError, match=r"shape \(6,\) but its first layer takes 4 inputs") as caught:
        load_model(edited, CARTPOLE)
    assert "\n" not in str(caught.value)
    acrobot = SimpleNamespace(env_id="Acrobot-v1", obs_shape=(6,), obs_dtype=np.dtype(np.float32), n_actions=3, frame_stack=1)
    for layout in LAYOUTS:
        with pytest.raises(UserError, match=r"SB3 saved observations of shape \(4,\), the environment gives \(6,\)"):
            load_model(in_layout(zips["DQN", "Mlp"], layout, tmp_path), acrobot)


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def with_observation_pickle(source: Path, out: Path, payload: bytes) -> Path:
    """A 1.0-layout zip whose pickled observation space is `payload`."""
    fixtures.as_layout(source, out, "1.0")
    with zipfile.ZipFile(out) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    data["observation_space"][":serialized:"] = base64.b64encode(payload).decode()
    with zipfile.ZipFile(out, "w") as archive:
        for name, content in {**entries, "data": json.dumps(data).encode()}.items():
            archive.writestr(name, content)
    return out


def test_a_pickled_space_that_asks_for_anything_else_is_refused_and_nothing_runs(zips, tmp_path):
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(marker)))  # the payload is real: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    with fixtures._FakeGym():
        outside = pickle.dumps(fixtures._FakeGym)  # a class outside the spaces
    cases = {"system": pickle.dumps(Payload(marker)), "_FakeGym": outside,
             "gym.envs.registration.make": b"\x80\x04cgym.envs.registration\nmake\n)R."}
    for name, payload in cases.items():
        path = with_observation_pickle(zips["DQN", "Mlp"], tmp_path / f"{len(name)}.zip", payload)
        with pytest.raises(UserError, match=rf"observation space.*asks for .*{name}.*refused") as caught:
            load_model(path, CARTPOLE)
        assert "\n" not in str(caught.value)
        result = CliRunner().invoke(main, ["compress", str(path), "--env", "CartPole-v1", "--out", str(tmp_path / "run")])
        assert result.exit_code == 2 and result.output.startswith("error: ") and result.output.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "run").exists()
    # An allowed class whose pickle is not a space (a RandomState alone) is refused too, by name.
    path = with_observation_pickle(zips["DQN", "Mlp"], tmp_path / "rng.zip", pickle.dumps(np.random.RandomState(0)))
    with pytest.raises(UserError, match=r"pickled observation space is a numpy\.random.*not a gym or gymnasium space"):
        load_model(path, CARTPOLE)


def test_other_algorithms_and_spaces_are_named(zips, tmp_path):
    with zipfile.ZipFile(zips["DQN", "Mlp"]) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    cases = [({"policy_class": {**data["policy_class"], "__module__": "sb3_contrib.ppo_mask.policies"}},
              r"a policy of sb3_contrib\.ppo_mask\.policies; ported: SB3's DQN .* and sb3-contrib's QR-DQN"),
             ({"action_space": {":type:": "<class 'gymnasium.spaces.box.Box'>", ":serialized:": "", "_shape": [2]}},
              r"action space is .*Box.*; DQN needs Discrete")]
    for change, message in cases:
        path = tmp_path / "other.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for name, content in {**entries, "data": json.dumps({**data, **change}).encode()}.items():
                archive.writestr(name, content)
        with pytest.raises(UserError, match=message):
            load_model(path, CARTPOLE)
