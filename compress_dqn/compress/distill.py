"""Q-value distillation: a student regresses the frozen baseline's Q-values on replay states.

Offline (no environment steps) and cheap: the teacher's Q-values come from a numpy forward pass.
A smaller student is the variant that makes inference actually faster, since sparse Dense
layers get no speed-up in TFLite/XNNPACK; it composes with quantization.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from compress_dqn._tf import tf, tf_keras
from compress_dqn.callbacks import LoopCallbacks
from compress_dqn.envs import EnvInfo
from compress_dqn.networks import KerasActor, NumpyActor, make_actor, network_for, q_from_outputs
from compress_dqn.progress import Progress
from compress_dqn.recipe import StudentConfig
from compress_dqn.replay import ReplayBuffer
from compress_dqn.train_state import TrainState
from compress_dqn.updates import UpdateFn, run_updates


def build_student(info: EnvInfo, cfg: StudentConfig) -> tf_keras.Model:
    """A fresh (untrained) student network."""
    return network_for(info, cfg, name="student")


def make_distill_update_fn(
    student: tf_keras.Model,
    optimizer: tf_keras.optimizers.Optimizer,
    max_grad_norm: float | None,
    jit_compile: bool,
    loss: str = "policy",
    temperature: float = 0.01,
    value_scale: float = 1.0,
) -> UpdateFn:
    """`update(obs, teacher_q)` over K stacked batches: K steps; returns (mean loss, mean Q).

    loss="mse" regresses all Q-values. A DQN's action gaps are tiny next to its Q-values
    (CartPole: median gap ~0.06 on Q ~100), so a small MSE can still flip most greedy actions.
    loss="policy" is policy distillation (Rusu et al., 2016): KL between the teacher's and the
    student's softmax(Q / temperature), which ranks actions wherever their gap exceeds the
    temperature, plus the Q-values' squared error divided by their variance (value_scale). The
    second term keeps outputs on the Q scale: with near-hard targets, KL alone keeps widening
    the student's gaps (LunarLander: Q errors of ~45), which then ruins int8 ranges.
    """
    tau = tf.constant(temperature, tf.float32)
    inv_var = tf.constant(1.0 / max(value_scale, 1e-8), tf.float32)

    def objective(q, teacher):
        if loss == "mse":
            return tf.reduce_mean(tf.square(q - teacher))
        p_teacher = tf.nn.softmax(teacher / tau)
        kl = tf.reduce_sum(
            p_teacher * (tf.nn.log_softmax(teacher / tau) - tf.nn.log_softmax(q / tau)), axis=-1
        )
        return tf.reduce_mean(kl) + inv_var * tf.reduce_mean(tf.square(q - teacher))

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def update(obs, teacher_q):
        total_loss = tf.constant(0.0)
        total_q = tf.constant(0.0)
        k_steps = tf.shape(obs)[0]
        for k in tf.range(k_steps):
            with tf.GradientTape() as tape:
                q = q_from_outputs(student(tf.cast(obs[k], tf.float32), training=True))
                step_loss = objective(q, teacher_q[k])
            grads = tape.gradient(step_loss, student.trainable_variables)
            if max_grad_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, max_grad_norm)
            optimizer.apply_gradients(zip(grads, student.trainable_variables))
            total_loss += step_loss
            total_q += tf.reduce_mean(q)
        steps = tf.cast(k_steps, tf.float32)
        return total_loss / steps, total_q / steps

    return update


def teacher_table(teacher: NumpyActor | KerasActor, replay: ReplayBuffer, lookups: int,
                  chunk: int = 4096) -> np.ndarray | None:
    """The teacher's Q-values of every replay row, where a fine-tune would otherwise compute more
    of them than the buffer holds (`lookups`: its steps x batch). None for frame-stacked buffers
    (a stack is rebuilt per sample) and for short fine-tunes.

    Why: the teacher's forward pass dominated distillation. The CartPole demo's 32x32 student
    looks up 2.56M Q-values in 40k steps from a buffer of 50k rows.
    """
    rows = replay.size
    if replay.frame_stack != 1 or lookups <= rows:
        return None
    return np.concatenate([teacher.q_values(replay.observations_at(np.arange(start, min(start + chunk, rows))))
                           for start in range(0, rows, chunk)])


class Distiller:
    """Offline distillation through the training loop's phase runner and callbacks.

    Each phase samples K*B replay observations, looks up (or computes, in numpy) the teacher's
    Q-values, and runs K gradient steps (fused, or one by one when a callback has batch hooks).
    """

    ckpt_dir: Path | None = None  # nothing to resume: distillation is short and offline

    def __init__(
        self,
        student: tf_keras.Model,
        teacher: tf_keras.Model,
        replay: ReplayBuffer,
        steps: int,
        learning_rate: float,
        batch_size: int,
        max_grad_norm: float | None = 10.0,
        jit_compile: bool = True,
        label: str = "distill",
        quiet: bool = False,
        phase_steps: int = 100,
        loss: str = "policy",
        temperature: float = 0.01,
        callbacks: Sequence[tf_keras.callbacks.Callback] = (),
    ) -> None:
        self.student, self.replay, self.steps = student, replay, steps
        self.batch_size, self.label, self.quiet = batch_size, label, quiet
        self.phase_steps = phase_steps
        self.state = TrainState()
        self.callbacks = LoopCallbacks(callbacks, student)
        self.teacher = make_actor(teacher)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate)
        self.optimizer.build(student.trainable_variables)
        # The Q-value term is scaled by the variance of the teacher's Q-values over replay states.
        probe = replay.sample_observations(min(10_000, 20 * batch_size))
        value_scale = float(self.teacher.q_values(probe).var())
        self.teacher_q = teacher_table(self.teacher, replay, steps * batch_size)
        self.update = make_distill_update_fn(
            student, self.optimizer, max_grad_norm, jit_compile, loss, temperature, value_scale
        )

    def run(self) -> float:
        """Train the student for `steps` gradient steps; returns the last phase's mean loss."""
        state = self.state
        progress = Progress(self.label, self.steps, 0, self.quiet)
        self.callbacks.on_train_begin()
        loss = float("nan")
        try:
            while state.gradient_step < self.steps:
                k = min(self.phase_steps, self.steps - state.gradient_step)
                rows = self.replay.sample_indices(k * self.batch_size)
                obs = self.replay.observations_at(rows)
                teacher_q = self.teacher_q[rows] if self.teacher_q is not None else self.teacher.q_values(obs)
                teacher_q = teacher_q.reshape(k, self.batch_size, -1)
                obs = obs.reshape((k, self.batch_size) + obs.shape[1:])
                loss, q_mean = run_updates(self, self.update, (obs, teacher_q))
                state.step = state.gradient_step
                self.callbacks.on_phase_end({"step": state.step, "gradient_step": state.gradient_step,
                                             "loss": loss, "q_mean": q_mean})
                progress.update(state.step, None)
        finally:
            progress.close()
        self.callbacks.on_train_end({"step": state.step, "gradient_step": state.gradient_step})
        return loss
