"""Why a variant lost the return, measured on the held-out states the baseline visits: the baseline's action gaps
against the variant's int8 Q-head step, and a float-head stand-in of a post-training int8 policy. This module
reloads the run's .tflite files (LiteRT only); findings.py reads results.json alone. No TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.evaluation.findings import is_student, post_training_int8
from compress_dqn.evaluation.results import RunResults

COARSE_HEAD_SHARE = 0.05
"""A Q-head's int8 step is named the reason where at least this share of the decisive states has an action gap below it,"""
COARSE_HEAD_DIFFERING = 0.5
"""or where at least this share of the states on which the variant's action differs does (MountainCar's DQN: a
32x32 student's head step of 0.135 was below the gap of 81% of the states it got wrong, ptq-int8's 0.017 of 25%)."""


@dataclass(frozen=True)
class Diagnosis:
    """What the held-out states show about one variant: the baseline's action gaps (best minus second-best
    Q-value) against the variant's int8 Q-head step, and where the variant's greedy action differs."""

    name: str
    states: int
    student: bool
    gap_median: float
    """The baseline's median gap: a state is decisive where its gap is at least this (run/context.decisive_states)."""
    decisive_agreement: float
    """Share of the decisive states where the variant plays the baseline's action."""
    differing: float
    """Share of all the states where it does not."""
    differing_gap_median: float | None
    """The baseline's median gap on the states where the variant's action differs (None where none does)."""
    output_step: float | None
    """The int8 step of the tensor the action is the argmax of (its quantization scale); None for a float head."""
    below_step_decisive: float | None
    """Share of the decisive states whose gap is below one output step (None for a float head)."""
    below_step_all: float | None
    """Share of all the states whose gap is below one output step."""
    differing_below_step: float | None
    """Share of the states where the action differs whose gap is below one output step."""
    gap_to_q: float | None = None
    """The baseline's median over the states of gap / mean |Q|: how fine a difference between Q-values of one
    magnitude its decisions take (int8 holds about 1/127 of a tensor's range)."""
    float_head_agreement: float | None = None
    """Post-training int8 of the baseline's own weights: its agreement with the baseline on all the states were its
    Q-head float (its int8 body's last activation, dequantized, times the baseline's float output layer); None for
    other variants. Where it is near 1 the int8 head (weights and step) is what changed the actions, else the body."""

    @property
    def head_share(self) -> float | None:
        """Of the states where the action differs, the share a float Q-head gets back (float_head_agreement's)."""
        if self.float_head_agreement is None or self.differing == 0:
            return None
        return max(0.0, self.float_head_agreement - (1 - self.differing)) / self.differing

    @property
    def coarse_head(self) -> bool:
        """The Q-head's step is the measured reason: it cannot resolve the gaps of enough decisive states."""
        if self.below_step_decisive is None:
            return False
        return self.below_step_decisive >= COARSE_HEAD_SHARE or (self.differing_below_step or 0.0) >= COARSE_HEAD_DIFFERING


def action_gaps(q_values: np.ndarray) -> np.ndarray:
    """Best minus second-best Q-value of each state (0 where there is one action)."""
    q = np.asarray(q_values)
    if q.shape[1] < 2:
        return np.zeros(len(q))
    top_two = np.sort(q, axis=1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0]


def diagnose(name: str, baseline_q: np.ndarray, baseline_actions: np.ndarray, actions: np.ndarray,
             output_step: float | None, student: bool = False, float_head_actions: np.ndarray | None = None) -> Diagnosis:
    """One variant's diagnosis from the baseline's Q-values and actions and the variant's actions on the same states."""
    gap = action_gaps(baseline_q)
    median = float(np.median(gap))
    decisive = gap >= median
    differs = np.asarray(actions) != np.asarray(baseline_actions)
    below = gap < output_step if output_step else None
    return Diagnosis(
        name=name, states=len(gap), student=student, gap_median=median,
        decisive_agreement=float(1 - differs[decisive].mean()), differing=float(differs.mean()),
        differing_gap_median=float(np.median(gap[differs])) if differs.any() else None,
        output_step=float(output_step) if output_step else None,
        below_step_decisive=float(below[decisive].mean()) if below is not None else None,
        below_step_all=float(below.mean()) if below is not None else None,
        differing_below_step=float(below[differs].mean()) if below is not None and differs.any() else None,
        gap_to_q=float(np.median(gap / np.maximum(np.abs(np.asarray(baseline_q, np.float64)).mean(axis=1), 1e-12))),
        float_head_agreement=(float(np.mean(np.asarray(float_head_actions) == np.asarray(baseline_actions)))
                              if float_head_actions is not None else None),
    )


def _policy_graph(tflite: Path) -> Any:
    """The file's policy graph; None where it is no policy graph this reader knows."""
    from compress_dqn.deploy.tflite.graph import read_policy_graph
    from compress_dqn.errors import UserError

    try:
        return read_policy_graph(tflite)
    except (UserError, ValueError, KeyError, StopIteration):
        return None


def head_step(tflite: Path | Any) -> float | None:
    """The quantization step of the tensor a policy's `action` is the argmax of (a file, or its policy
    graph); None where it is float (a float Q-head, or a float policy), or where the file is no policy
    graph this reader knows."""
    graph = _policy_graph(tflite) if isinstance(tflite, (str, Path)) else tflite
    head = graph.action_head if graph is not None else None
    if head is None or not head.quantized:
        return None
    return float(np.max(head.scales))


class FloatHeadPolicy:
    """A post-training int8 policy were its Q-head float: LiteRT runs the file keeping every tensor, the head's int8
    input is dequantized and multiplied by the baseline's float output layer (the file's split heads take the same
    argmax). Greedy actions of a batch, as TFLitePolicy.actions."""

    CHUNK = 1024
    """States per interpreter call: every tensor is kept, so a call's memory grows with its batch (an image CNN's)."""

    def __init__(self, tflite: Path, hidden: Any, kernel: np.ndarray, bias: np.ndarray) -> None:
        from compress_dqn.deploy.litert.policy import TFLitePolicy

        self._policy = TFLitePolicy(tflite, keep_tensors=True)
        self._hidden, self._kernel, self._bias = hidden, kernel, bias

    def actions(self, states: np.ndarray) -> np.ndarray:
        if len(states) > self.CHUNK:
            return np.concatenate([self.actions(states[i:i + self.CHUNK]) for i in range(0, len(states), self.CHUNK)])
        self._policy.actions(states)
        hidden = self._hidden
        h = (self._policy.tensor(hidden.index).astype(np.float64) - float(hidden.zero_points[0])) * float(hidden.scales[0])
        return (h.reshape(len(states), -1) @ self._kernel + self._bias).argmax(1)


def float_head_policy(tflite: Path, weights: Path, graph: Any = None) -> FloatHeadPolicy | None:
    """FloatHeadPolicy of a post-training int8 file (or its policy graph, read already) with the baseline's output
    layer (the last kernel and bias of baseline/weights.npz); None where the file has no quantized fully connected
    head or the shapes do not match (a baseline whose last arrays are not its output layer)."""
    if not Path(weights).is_file():
        return None
    graph = graph if graph is not None else _policy_graph(tflite)
    head = next((op for op in graph.ops if op.outputs[0] is graph.action_head), None) if graph is not None else None
    if head is None or head.kind != "FULLY_CONNECTED" or not head.inputs[0].quantized:
        return None
    hidden = head.inputs[0]
    with np.load(weights) as arrays:
        names = sorted(arrays.files)
        if len(names) < 2:
            return None
        kernel, bias = (arrays[k].astype(np.float64) for k in names[-2:])
    if kernel.ndim != 2 or kernel.shape != (hidden.shape[-1], graph.n_actions) or bias.shape != (graph.n_actions,):
        return None
    return FloatHeadPolicy(tflite, hidden, kernel, bias)


def diagnoses(results: RunResults, run_dir: Path) -> list[Diagnosis]:
    """Each variant's diagnosis, measured now on the run's held-out states with the baseline's and the
    variant's TFLite files (LiteRT only); [] where the run directory lacks them (a results.json alone)."""
    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.errors import UserError
    from compress_dqn.fileio import load_dict

    run_dir = Path(run_dir)
    base = results.baseline
    base_file = run_dir / base.artifacts.get("tflite", "")
    heldout = base_file.parent / "heldout_obs.npz"
    if not (base_file.is_file() and heldout.is_file()):
        return []
    states = load_dict(heldout)["observations"]
    if not len(states):
        return []
    reference = TFLitePolicy(base_file)
    baseline_q, baseline_actions = reference.q_values(states), reference.actions(states)
    found = []
    for v in results.variants[1:]:
        path = run_dir / v.artifacts.get("tflite", "")
        if not path.is_file():
            continue
        graph, emulated = _policy_graph(path), None
        if post_training_int8(v) and graph is not None:
            try:
                policy = float_head_policy(path, base_file.parent / "weights.npz", graph)
                emulated = policy.actions(states) if policy is not None else None
            except (UserError, ValueError, RuntimeError):
                emulated = None
        found.append(diagnose(v.name, baseline_q, baseline_actions, TFLitePolicy(path).actions(states),
                              head_step(graph), student=is_student(v), float_head_actions=emulated))
    return found
