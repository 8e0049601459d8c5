"""RLlib DQN checkpoints (new API stack) port exactly, read only through the restricted pickle reader.

The fixtures (tests/data/port/rllib) were made by benchmarks/rllib_dqn.py --fixture in its own venv
(ray 2.60, torch): an untrained dueling module ([8, 8], tanh) as a checkpoint cut to the files the
reader opens, and a plain-head one ([8], relu) as an RLModule directory, each with the Q-values
RLlib's module computes for forward_inference (compute_q_values) on CartPole states.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.errors import UserError
from compress_dqn.port.baseline import load_model
from compress_dqn.port.check import cross_check

RLLIB = Path(__file__).resolve().parent / "data" / "port" / "rllib"
DUELING, PLAIN = RLLIB / "dueling_checkpoint", RLLIB / "plain_module"
MODULE = Path("learner_group/learner/rl_module/default_policy")
CARTPOLE = SimpleNamespace(env_id="CartPole-v1", obs_shape=(4,), obs_dtype=np.dtype(np.float32), n_actions=2, frame_stack=1)


def _no_ray(monkeypatch) -> None:
    """Make `import ray` fail in this process for the test: another test in the same worker may have
    imported ray (the Ray executor), so 'not in sys.modules' would say nothing about the reader."""
    for name in ("ray", "ray.rllib"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("path, expected", [(DUELING, DUELING), (DUELING / "learner_group/learner/rl_module", DUELING),
                                            (DUELING / MODULE, DUELING), (PLAIN, PLAIN)])
def test_a_checkpoint_or_module_directory_gives_rllibs_q_values(path, expected, monkeypatch):
    _no_ray(monkeypatch)
    data = json.loads((expected / "expected.json").read_text())
    states, q = np.asarray(data["states"], np.float32), np.asarray(data["q_values"], np.float32)
    model = load_model(path, CARTPOLE)
    ported = model.predict(states, verbose=0)
    assert np.abs(ported - q).max() <= 1e-4
    assert (ported.argmax(axis=1) == np.asarray(data["actions"])).all()
    assert len(set(data["actions"])) == 2  # both actions occur
    record = cross_check(path, model, states, CARTPOLE)
    assert record.checked and record.max_abs_q_diff <= 1e-4 and record.action_agreement == 1.0, record
    assert sys.modules["ray"] is None  # nothing the pickles name was imported (an import would have raised)


def test_the_dueling_fold_is_not_the_advantage_stream_alone():
    """Without the value stream and the centring the Q-values differ: the fold is what makes them match."""
    from compress_dqn.port.tensor_pickle import read_restricted_pickle

    state = read_restricted_pickle((DUELING / MODULE / "module_state.pkl").read_bytes(), "x", ("ray.",))
    data = json.loads((DUELING / "expected.json").read_text())
    h = np.asarray(data["states"], np.float64)
    for i in (0, 2):
        h = np.tanh(h @ state[f"encoder.net.mlp.{i}.weight"].T + state[f"encoder.net.mlp.{i}.bias"])
    advantage = h @ state["af.net.mlp.0.weight"].T + state["af.net.mlp.0.bias"]
    assert np.abs(advantage - np.asarray(data["q_values"])).max() > 1e-3


def _patched(tmp_path: Path, source: Path, file: Path, old: bytes, new: bytes) -> Path:
    path = tmp_path / source.name
    shutil.copytree(source, path)
    data = (path / file).read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    (path / file).write_bytes(data.replace(old, new))
    return path


@pytest.mark.parametrize("source, file, old, new, said", [
    (PLAIN, Path("class_and_ctor_args.pkl"), b"num_atoms\x94K\x01", b"num_atoms\x94K\x33", "num_atoms 51 (distributional"),
    (PLAIN, Path("class_and_ctor_args.pkl"), b"\x8c\x04relu", b"\x8c\x04gelu", "fcnet_activation 'gelu'"),
    (DUELING, Path("env_runner/env_to_module_connector/class_and_ctor_args.pkl"), b"\x8c\rNumpyToTensor",
     b"\x8c\rMeanStdFilter", "connector MeanStdFilter changes the observation"),
])
def test_what_the_port_cannot_fold_is_refused_in_one_line(tmp_path, source, file, old, new, said, monkeypatch):
    _no_ray(monkeypatch)
    path = _patched(tmp_path, source, file, old, new)
    with pytest.raises(UserError) as caught:
        load_model(path, CARTPOLE)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert sys.modules["ray"] is None  # the classes the pickles name stayed records


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("file", ["class_and_ctor_args.pkl", "module_state.pkl"])
def test_a_pickle_naming_any_other_class_is_refused_and_nothing_runs(tmp_path, file, monkeypatch):
    _no_ray(monkeypatch)
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()  # the payload is real: plain pickle runs it
    marker.unlink()
    path = tmp_path / "module"
    shutil.copytree(PLAIN, path)
    (path / file).write_bytes(pickle.dumps({"class": Payload(marker), "encoder.net.mlp.0.weight": Payload(marker)}))
    with pytest.raises(UserError) as caught:
        load_model(path, CARTPOLE)
    assert "system" in str(caught.value) and "refused" in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists() and sys.modules["ray"] is None


def test_dueling_heads_with_hidden_layers_fold_exactly():
    """head_fcnet_hiddens: each stream's hidden layers run side by side in one wider layer (block-diagonal)."""
    from compress_dqn.port.rllib import _fold_heads

    rng = np.random.default_rng(0)

    def stack(widths):
        return [(rng.normal(size=(o, i)), rng.normal(size=o)) for i, o in zip(widths[:-1], widths[1:])]

    af, vf = stack([6, 5, 4, 3]), stack([6, 7, 2, 1])
    h = rng.normal(size=(20, 6))

    def run(layers, x):
        for n, (w, b) in enumerate(layers):
            x = x @ w.T + b
            x = np.maximum(x, 0) if n < len(layers) - 1 else x
        return x

    a = run(af, h)
    assert np.abs(run(_fold_heads(af, vf, 3), h) - (a - a.mean(axis=1, keepdims=True) + run(vf, h))).max() < 1e-12
