"""The training loops' events, dispatched to tf_keras callbacks so Keras and tfmot callbacks plug in.

The mapping follows fit() with one epoch: on_train_begin, on_epoch_begin(0), the batch hooks
around every gradient step, on_epoch_end(0), on_train_end. tfmot's UpdatePruningStep applies its
final masks in on_epoch_end, as under fit(). Batch hooks cost a call per gradient step, so a
training phase runs as one fused call unless some callback implements them. `PhaseCallback`
adds the one event fit() lacks: the end of a training phase (K gradient steps).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from pydantic import BaseModel

from compress_dqn._tf import tf_keras
from compress_dqn.envs.episodes import run_episodes, run_episodes_side_by_side
from compress_dqn.rl.networks import KerasActor, make_actor

Logs = dict[str, float]


class Interrupt(Exception):
    """Raised by a callback to stop training at once (tests simulate a crash with it)."""


class PhaseCallback(tf_keras.callbacks.Callback):
    """A Keras callback that also hears the end of each training phase."""

    def on_phase_end(self, logs: Logs | None = None) -> None:
        """After each phase; logs: step (env steps), gradient_step, loss and q_mean (the phase's means)."""


class LoopCallbacks:
    """A loop's callbacks, bound to its model, with one method per event the loop raises."""

    def __init__(self, callbacks: Iterable[tf_keras.callbacks.Callback], model: tf_keras.Model) -> None:
        self.all = list(callbacks)
        for callback in self.all:
            callback.set_model(model)
        # Keras' own test (CallbackList uses it) of whether a callback overrides a batch hook.
        self.per_step = [c for c in self.all if c._implements_train_batch_hooks()]
        self.per_phase = [c for c in self.all if isinstance(c, PhaseCallback)]

    def on_train_begin(self) -> None:
        for callback in self.all:
            callback.on_train_begin()
        for callback in self.all:
            callback.on_epoch_begin(0)

    def on_gradient_step_begin(self, gradient_step: int) -> None:
        for callback in self.per_step:
            callback.on_train_batch_begin(gradient_step)

    def on_gradient_step_end(self, gradient_step: int, logs: Logs) -> None:
        for callback in self.per_step:
            callback.on_train_batch_end(gradient_step, logs)

    def on_phase_end(self, logs: Logs) -> None:
        for callback in self.per_phase:
            callback.on_phase_end(logs)

    def on_train_end(self, logs: Logs) -> None:
        for callback in self.all:
            callback.on_epoch_end(0, logs)
        for callback in self.all:
            callback.on_train_end(logs)


class Selection(BaseModel):
    """A fine-tune's snapshot selection: each evaluated gradient step's score and the step kept."""

    selected_step: int
    selected_return: float
    episodes: int
    evaluations: list[tuple[int, float]]


class KeepBestPolicy(PhaseCallback):
    """Every `every` gradient steps and at the end, play the model greedily on selection episodes
    and keep the weights with the highest mean return (the latest among ties).

    Why: a distilled student can match the teacher's actions on 95% of replay states and still
    fail to balance a pole, depending on its initialization; the baseline's training keeps its
    best evaluated weights for the same reason. The selection episodes (train.eval_seed..) are
    disjoint from the final evaluation's, so the verdict is not selected on.
    """

    def __init__(self, env: Any, seeds: Sequence[int], every: int, first_step: int = 0) -> None:
        """first_step: consider no weights from before this gradient step (a pruning fine-tune's
        model reaches its target sparsity there; the end of training is always considered)."""
        super().__init__()
        self.env, self.seeds, self.every, self.first_step = env, list(seeds), every, first_step
        self.next_at = max(every, first_step)
        self.best: tuple[float, int, list[Any]] | None = None
        self.history: list[tuple[int, float]] = []

    def _consider(self, gradient_step: int) -> None:
        actor = make_actor(self.model)
        if isinstance(actor, KerasActor):  # costly per call, not per row: one call per step for all episodes
            returns = run_episodes_side_by_side(actor.q_values, self.env, self.seeds)
        else:  # cheap per call: one episode at a time, as every earlier build played them
            returns = run_episodes(actor.act, self.env, self.seeds)
        score = float(sum(returns) / len(self.seeds))
        self.history.append((gradient_step, score))
        if self.best is None or score >= self.best[0]:
            self.best = (score, gradient_step, self.model.get_weights())

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if self.first_step == 0:  # the weights it starts from (a QAT fine-tune can make a good student worse)
            self._consider(0)

    def on_phase_end(self, logs: Logs | None = None) -> None:
        if logs["gradient_step"] >= self.next_at:
            self._consider(int(logs["gradient_step"]))
            self.next_at = (int(logs["gradient_step"]) // self.every + 1) * self.every

    def on_train_end(self, logs: Logs | None = None) -> None:
        if not self.history or self.history[-1][0] != logs["gradient_step"]:
            self._consider(int(logs["gradient_step"]))
        self.model.set_weights(self.best[2])

    def summary(self) -> Selection:
        """What the selection saw and kept, for the variant's details."""
        return Selection(selected_step=self.best[1], selected_return=self.best[0], episodes=len(self.seeds),
                         evaluations=[(step, score) for step, score in self.history])
