"""The port check: a ported network's Q-values against the source's own runtime, on states the policy visits.

An importer can be wrong in ways no shape check sees (a transposed kernel, a flatten order, a
missed /255), so every port runs the original file in its own runtime (SB3's QNetwork on torch,
torch, onnxruntime, a SavedModel's `action` signature) on the same observations and records the
largest absolute Q difference and how often the greedy actions agree (agreement alone where the
source gives actions, not Q-values). Without that runtime the record says the port was not
cross-checked and why, instead of passing silently.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compress_dqn._tf import tf_keras
from compress_dqn.envs.environment import EnvInfo
from compress_dqn.evaluation.results import PortCheck
from compress_dqn.port.load import file_kind, read_port
from compress_dqn.replay.buffer import ReplayBuffer, sampling_undone

CHECK_STATES = 512


def compare(ported: np.ndarray, source: np.ndarray) -> dict[str, float]:
    """Largest |dQ| and greedy-action agreement between two (n, actions) Q-value arrays."""
    ported, source = np.asarray(ported, dtype=np.float64), np.asarray(source, dtype=np.float64)
    return {"max_abs_q_diff": float(np.max(np.abs(ported - source))),
            "action_agreement": float(np.mean(ported.argmax(axis=1) == source.argmax(axis=1)))}


def cross_check(path: str | Path, model: tf_keras.Model, observations: np.ndarray,
                info: EnvInfo) -> PortCheck | None:
    """The port check on `observations` (None for a Keras file or a run's baseline: nothing was ported)."""
    path = Path(path)
    kind = file_kind(path)
    if kind in ("keras", "run"):
        return None
    port = read_port(path, info, kind)
    record = PortCheck(format=port.format, checked=False, states=len(observations), notes=list(port.net.notes))
    try:
        reference = port.reference()
    except ImportError as exc:
        return record.model_copy(update={"reason": f"not cross-checked: {exc}"})
    source = reference(observations)
    ported_q = model.predict(np.asarray(observations), batch_size=256, verbose=0)
    if port.gives_actions:
        agreement = float(np.mean(ported_q.argmax(axis=1) == np.asarray(source).reshape(-1)))
        notes = [*record.notes, "|dQ| not measurable: the source gives greedy actions, not Q-values"]
        return record.model_copy(update={"checked": True, "runtime": port.runtime(), "action_agreement": agreement,
                                         "notes": notes})
    return record.model_copy(update={"checked": True, "runtime": port.runtime(), **compare(ported_q, source)})


def check_port(path: str | Path, model: tf_keras.Model, replay: ReplayBuffer, info: EnvInfo) -> PortCheck | None:
    """The port check on states of the baseline's data, leaving the replay's sampling where it was."""
    with sampling_undone(replay):
        observations = replay.sample_observations(min(CHECK_STATES, replay.num_transitions))
    return cross_check(path, model, observations, info)

