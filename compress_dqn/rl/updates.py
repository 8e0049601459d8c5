"""Gradient updates and the runner of one training phase, shared by the DQN loop and distillation.

A training phase's K gradient steps run as ONE compiled call (XLA when cfg.jit_compile): the
target network is constant during a phase, so its forward pass is batched over the whole phase,
and the per-call overhead of TensorFlow is paid once per phase instead of once per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from compress_dqn.rl import fast_update
from compress_dqn.rl.fast_update import UpdateFn
from compress_dqn._tf import tf, tf_keras
from compress_dqn.rl.callbacks import LoopCallbacks
from compress_dqn.errors import UserError
from compress_dqn.rl.networks import q_from_outputs
from compress_dqn.recipe.schema import TrainConfig
from compress_dqn.rl.train_state import TrainState, latest_checkpoint



class TrainingDiverged(UserError):
    """Non-finite loss or Q-values: the recipe's hyperparameters, not a bug, so a one-line error."""


def make_update_fn(
    model: tf_keras.Model, target: tf_keras.Model, optimizer: tf_keras.optimizers.Optimizer, cfg: TrainConfig,
) -> UpdateFn:
    """`update(obs, actions, rewards, next_obs, discounts)` over K stacked batches.

    discounts: the bootstrapped value's factor, gamma**n * (1 - terminated) for n-step returns.
    A plain Dense MLP with a plain tf_keras Adam gets the faster hand-derived update (same math,
    see fast_update); anything else (tfmot wrappers, CNNs, other optimizers) the generic one.
    """
    fast = fast_update.make_update_fn(model, target, optimizer, cfg)
    return fast if fast is not None else make_generic_update_fn(model, target, optimizer, cfg)


def _td_loss(error: tf.Tensor, kind: str) -> tf.Tensor:
    if kind == "huber":
        abs_error = tf.abs(error)
        return tf.reduce_mean(tf.where(abs_error < 1.0, 0.5 * tf.square(error), abs_error - 0.5))
    return tf.reduce_mean(tf.square(error))


def _gradient_step(model: tf_keras.Model, optimizer: tf_keras.optimizers.Optimizer, cfg: TrainConfig) -> Callable:
    """One TD gradient step through GradientTape and optimizer.apply_gradients; returns (loss, mean Q)."""
    loss_scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

    def one_step(obs, actions, td_target):
        with tf.GradientTape() as tape:
            q_all = tf.cast(q_from_outputs(model(obs, training=True)), tf.float32)
            q_taken = tf.gather(q_all, actions, batch_dims=1)
            loss = _td_loss(tf.stop_gradient(td_target) - q_taken, cfg.loss)
            # Mixed precision: scale the loss so float16 gradients do not underflow.
            objective = optimizer.get_scaled_loss(loss) if loss_scaled else loss
        grads = tape.gradient(objective, model.trainable_variables)
        if loss_scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        if cfg.max_grad_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, cfg.max_grad_norm)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.reduce_mean(q_taken)

    return one_step


def make_generic_update_fn(
    model: tf_keras.Model, target: tf_keras.Model, optimizer: tf_keras.optimizers.Optimizer, cfg: TrainConfig,
) -> UpdateFn:
    """The update through the Keras model, GradientTape and the optimizer: works for any model
    (tfmot wrappers, split heads, CNNs), double DQN and any optimizer."""
    one_step = _gradient_step(model, optimizer, cfg)

    @tf.function(jit_compile=cfg.jit_compile, reduce_retracing=True)
    def update(obs, actions, rewards, next_obs, discounts):
        k_steps = tf.shape(obs)[0]
        batch = tf.shape(obs)[1]
        if not cfg.double_dqn:
            # The target network is fixed for the phase: one batched forward pass for all K steps.
            flat_next = tf.reshape(next_obs, tf.concat([[k_steps * batch], tf.shape(next_obs)[2:]], 0))
            next_q = tf.reshape(tf.cast(target(flat_next, training=False), tf.float32), [k_steps, batch, -1])
            all_targets = rewards + discounts * tf.reduce_max(next_q, axis=-1)
        total_loss = tf.constant(0.0)
        total_q = tf.constant(0.0)
        for k in tf.range(k_steps):
            if cfg.double_dqn:
                next_actions = tf.argmax(q_from_outputs(model(next_obs[k], training=False)), axis=-1, output_type=tf.int32)
                next_values = tf.gather(tf.cast(target(next_obs[k], training=False), tf.float32), next_actions, batch_dims=1)
                td_target = rewards[k] + discounts[k] * next_values
            else:
                td_target = all_targets[k]
            loss, q_mean = one_step(obs[k], actions[k], td_target)
            total_loss += loss
            total_q += q_mean
        steps = tf.cast(k_steps, tf.float32)
        return total_loss / steps, total_q / steps

    return update


def make_soft_update_fn(model: tf_keras.Model, target: tf_keras.Model) -> Callable[[tf.Tensor], None]:
    """soft_update(tau): target <- tau * online + (1 - tau) * target, over all weights."""

    @tf.function
    def soft_update(tau):
        for online_var, target_var in zip(model.weights, target.weights):
            target_var.assign(tau * online_var + (1.0 - tau) * target_var)

    return soft_update


class Learner(Protocol):
    """What run_updates needs from the loop calling it (DQNTrainer, Distiller)."""

    label: str
    state: TrainState
    callbacks: LoopCallbacks
    ckpt_dir: Path | None


def call_update(update: UpdateFn, arrays: tuple[np.ndarray, ...]) -> tuple[tf.Tensor, tf.Tensor]:
    """update(*arrays), through the concrete function traced for these shapes and dtypes.

    A tf.function call binds and hashes its arguments to find its trace each time, which costs
    about as much as a small network's update (docs/lunarlander-training.md), so it is done once
    per shape here. The same graph runs, so results are identical.
    """
    if not hasattr(update, "get_concrete_function"):
        return update(*arrays)
    cache = update.__dict__.setdefault("_concrete_by_shape", {})
    key = tuple((tuple(a.shape), str(a.dtype)) for a in arrays)
    concrete = cache.get(key)
    if concrete is None:
        concrete = cache[key] = update.get_concrete_function(*arrays)
    return concrete(*(tf.convert_to_tensor(a) for a in arrays))


def run_updates(learner: Learner, update: UpdateFn, arrays: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """Run the K gradient steps stacked in `arrays` (leading axis K) and return (loss, q_mean).

    One fused call, unless a callback has batch hooks: then one call per step, hooks around each.
    Advances learner.state.gradient_step and refuses a non-finite loss.
    """
    state, callbacks = learner.state, learner.callbacks
    k_steps = len(arrays[0])
    if callbacks.per_step:
        losses, qs = [], []
        for k in range(k_steps):
            callbacks.on_gradient_step_begin(state.gradient_step)
            loss_t, q_t = call_update(update, tuple(a[k : k + 1] for a in arrays))
            losses.append(float(loss_t))
            qs.append(float(q_t))
            callbacks.on_gradient_step_end(state.gradient_step, {"loss": losses[-1], "q_mean": qs[-1]})
            state.gradient_step += 1
        loss, q_mean = float(np.mean(losses)), float(np.mean(qs))
    else:
        loss_t, q_t = call_update(update, arrays)
        loss, q_mean = float(loss_t), float(q_t)
        state.gradient_step += k_steps
    if not (np.isfinite(loss) and np.isfinite(q_mean)):
        what = f"loss {loss}" if not np.isfinite(loss) else f"mean Q-value {q_mean}"
        kept = latest_checkpoint(learner.ckpt_dir) if learner.ckpt_dir is not None else None
        where = f"; the last good checkpoint is kept in {kept}" if kept is not None else ""
        raise TrainingDiverged(
            f"[{learner.label}] training diverged: {what} at env step {state.step} (gradient step "
            f"{state.gradient_step}); lower the learning rate or set max_grad_norm{where}"
        )
    return loss, q_mean
