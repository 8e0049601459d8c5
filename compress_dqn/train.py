"""The DQN loop: reads top to bottom like CleanRL's dqn.py, but importable and resumable.

Semantics follow Stable-Baselines3 so RL Zoo hyperparameters mean the same thing here:
training phases every `train_freq` env steps once `learning_starts` have passed, each of
`gradient_steps` updates; target updates counted in env steps. Speed comes from doing each
training phase as ONE XLA-compiled call (the target network is constant during a phase, so its
forward pass is batched over the whole phase) and from acting in numpy, not eager TensorFlow.

Checkpoints (weights, optimizer, replay, counters, RNG states; npz + JSON, no pickle) are taken
at the first episode end after each `checkpoint_interval`, so a resumed run replays exactly the
same stream as an uninterrupted one on CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from compress_dqn._tf import (
    configure_device, configure_threads, mixed_precision_policy, set_seed, tf, tf_keras, use_xla,
)
from compress_dqn.envs import EnvInfo, env_info, make_env_from, rng_state, seed_env, set_rng_state
from compress_dqn.errors import UserError
from compress_dqn.evaluate import run_episodes
from compress_dqn.fileio import load_arrays, load_dict, save_arrays, write_text_atomic
from compress_dqn.networks import make_actor, network_for, q_from_outputs
from compress_dqn.progress import Progress
from compress_dqn.recipe import EnvConfig, ReplayConfig, TrainConfig
from compress_dqn.replay import ReplayBuffer
from compress_dqn.resources import replay_capacity


class TrainHooks(Protocol):
    """Callbacks into the loop, so pruning and QAT fine-tunes reuse it instead of copying it.

    Set `per_gradient_step = True` to get `on_gradient_step` before every gradient step (tfmot's
    pruning step must advance once per update); the loop then runs updates one call each.
    """

    per_gradient_step: bool

    def on_train_begin(self, trainer: DQNTrainer) -> None: ...
    def on_gradient_step(self, trainer: DQNTrainer) -> None: ...
    def on_phase_end(self, trainer: DQNTrainer) -> None: ...
    def on_train_end(self, trainer: DQNTrainer) -> None: ...


class Interrupt(Exception):
    """Raised by a hook to stop training at once (tests simulate a crash with it)."""


@dataclass
class TrainResult:
    """What training produced; the model holds the kept (best or last) weights."""

    model: tf_keras.Model
    replay: ReplayBuffer
    info: EnvInfo
    env_steps: int
    gradient_steps: int
    episodes: int
    wall_seconds: float
    env_steps_per_second: float
    resumed_from: int | None
    selected_step: int | None
    selected_return: float | None
    episode_returns: list[float] = field(default_factory=list)


def linear_epsilon(step: int, cfg: TrainConfig) -> float:
    """SB3's linear schedule: initial -> final over exploration_fraction of the run."""
    span = cfg.exploration_fraction * cfg.total_timesteps
    progress = 1.0 if span <= 0 else min(1.0, step / span)
    return cfg.exploration_initial_eps + progress * (cfg.exploration_final_eps - cfg.exploration_initial_eps)


def _make_generic_update_fn(
    model: tf_keras.Model,
    target: tf_keras.Model,
    optimizer: tf_keras.optimizers.Optimizer,
    cfg: TrainConfig,
) -> Any:
    """The update through the Keras model, GradientTape and optimizer.apply_gradients: works for
    any model (tfmot wrappers, split heads, CNNs), double DQN and any optimizer."""

    def td_loss(error: tf.Tensor) -> tf.Tensor:
        if cfg.loss == "huber":
            abs_error = tf.abs(error)
            return tf.reduce_mean(tf.where(abs_error < 1.0, 0.5 * tf.square(error), abs_error - 0.5))
        return tf.reduce_mean(tf.square(error))

    loss_scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

    def one_step(obs, actions, td_target):
        with tf.GradientTape() as tape:
            q_all = tf.cast(q_from_outputs(model(obs, training=True)), tf.float32)
            q_taken = tf.gather(q_all, actions, batch_dims=1)
            loss = td_loss(tf.stop_gradient(td_target) - q_taken)
            # Mixed precision: scale the loss so float16 gradients do not underflow.
            objective = optimizer.get_scaled_loss(loss) if loss_scaled else loss
        grads = tape.gradient(objective, model.trainable_variables)
        if loss_scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        if cfg.max_grad_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, cfg.max_grad_norm)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.reduce_mean(q_taken)

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


def make_update_fn(
    model: tf_keras.Model,
    target: tf_keras.Model,
    optimizer: tf_keras.optimizers.Optimizer,
    cfg: TrainConfig,
) -> Any:
    """Build `update(obs, actions, rewards, next_obs, discounts)` over K stacked batches.

    discounts: the bootstrapped value's factor, gamma**n * (1 - terminated) for n-step returns.
    Inputs have a leading phase axis K; the call runs K gradient steps and returns the mean
    loss and mean Q. Compiled with XLA when cfg.jit_compile. A plain Dense MLP trained with a
    plain tf_keras Adam gets a hand-written fast path (same math, see `_make_mlp_adam_update_fn`);
    anything else (pruning/QAT wrappers, other optimizers) the generic one.
    """
    if _mlp_adam_supported(model, optimizer, cfg):
        return _make_mlp_adam_update_fn(model, target, optimizer, cfg)
    return _make_generic_update_fn(model, target, optimizer, cfg)


_FAST_ACTIVATIONS = ("relu", "linear")


def _mlp_adam_supported(model: Any, optimizer: Any, cfg: TrainConfig) -> bool:
    """Whether the fast path computes exactly what the generic one would."""
    if cfg.loss not in ("huber", "mse"):
        return False
    if not isinstance(model, tf_keras.Sequential) or not model.layers:
        return False
    expected = []
    for layer in model.layers:
        if type(layer) is not tf_keras.layers.Dense or not layer.use_bias or not layer.trainable:
            return False
        if getattr(layer.activation, "__name__", None) not in _FAST_ACTIVATIONS:
            return False
        if layer.kernel_constraint is not None or layer.bias_constraint is not None:
            return False
        if layer.dtype_policy.compute_dtype != "float32" or layer.kernel.dtype != tf.float32:
            return False
        expected += [layer.kernel, layer.bias]
    if len(model.input_shape) != 2:  # flat observations only (the generic path handles the rest)
        return False
    if [id(v) for v in model.trainable_variables] != [id(v) for v in expected]:
        return False
    if type(optimizer) is not tf_keras.optimizers.Adam:
        return False
    if optimizer.amsgrad or getattr(optimizer, "adaptive_epsilon", False) or optimizer.use_ema:
        return False
    if optimizer.weight_decay is not None or optimizer.clipnorm is not None:
        return False
    if optimizer.clipvalue is not None or optimizer.global_clipnorm is not None:
        return False
    if isinstance(optimizer._learning_rate, tf_keras.optimizers.schedules.LearningRateSchedule):
        return False
    if not all(isinstance(x, (int, float)) for x in (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon)):
        return False
    try:
        keys = [optimizer._var_key(v) for v in expected]
        return all(k in optimizer._index_dict for k in keys)
    except AttributeError:
        return False


def _batch_sum(x: tf.Tensor) -> tf.Tensor:
    """Sum over axis 0 in chunks of 32: XLA CPU turns a longer reduce into a slow reduce-window."""
    n = x.shape[0]
    if n is None or n <= 32 or n % 32:
        return tf.reduce_sum(x, axis=0)
    return _batch_sum(tf.reduce_sum(tf.reshape(x, [n // 32, 32] + x.shape[1:].as_list()), axis=1))


def _sum_of_squares(g: tf.Tensor) -> tf.Tensor:
    """sum(g**2); a large matrix goes through a matrix-vector product, far faster under XLA CPU."""
    if g.shape.rank == 2 and g.shape.num_elements() is not None and g.shape.num_elements() > 4096:
        return tf.reduce_sum(tf.matmul(tf.square(g), tf.ones([g.shape[1], 1], g.dtype)))
    return tf.reduce_sum(tf.square(g))


def _make_mlp_adam_update_fn(
    model: tf_keras.Sequential,
    target: tf_keras.Model,
    optimizer: tf_keras.optimizers.Adam,
    cfg: TrainConfig,
) -> Any:
    """The generic update, hand-derived for a Dense MLP and tf_keras Adam (about 1.3x faster).

    Same math as `_make_generic_update_fn`: the same TD loss and its exact gradient
    (backpropagated by hand with explicit matmuls), tf.clip_by_global_norm's scaling, and
    tf_keras Adam's update of the optimizer's own slots and iteration counter, one gradient step
    after another. Only summation orders differ (float32 round-off, ~1e-7 relative).
    """
    layers = list(model.layers)
    activations = [layer.activation.__name__ for layer in layers]
    params = [v for layer in layers for v in (layer.kernel, layer.bias)]
    slots = [optimizer._index_dict[optimizer._var_key(v)] for v in params]
    momentums = [optimizer._momentums[i] for i in slots]
    velocities = [optimizer._velocities[i] for i in slots]
    beta_1, beta_2, epsilon = float(optimizer.beta_1), float(optimizer.beta_2), float(optimizer.epsilon)
    huber = cfg.loss == "huber"
    clip = cfg.max_grad_norm
    n_actions = int(params[-1].shape[0])

    def forward(weights, x):
        """Every layer's input, then the Q-values: [x, h1, ..., q]."""
        hidden = [x]
        for i, act in enumerate(activations):
            x = tf.matmul(x, weights[2 * i]) + weights[2 * i + 1]
            if act == "relu":
                x = tf.nn.relu(x)
            hidden.append(x)
        return hidden

    def gradients(weights, obs, onehot, td_target):
        hidden = forward(weights, obs)  # hidden[i] is the input of layer i
        q_taken = tf.reduce_sum(hidden[-1] * onehot, axis=-1)
        error = td_target - q_taken
        batch = tf.cast(tf.shape(error)[0], tf.float32)
        if huber:
            abs_error = tf.abs(error)
            loss = tf.reduce_mean(tf.where(abs_error < 1.0, 0.5 * tf.square(error), abs_error - 0.5))
            d_error = tf.where(abs_error < 1.0, error, tf.sign(error)) / batch
        else:
            loss = tf.reduce_mean(tf.square(error))
            d_error = 2.0 * error / batch
        dz = onehot * (-d_error)[:, None]  # d loss / d pre-activation of the last layer
        grads = [None] * len(weights)
        for i in reversed(range(len(activations))):
            if activations[i] == "relu":
                dz = tf.where(hidden[i + 1] > 0, dz, tf.zeros_like(dz))
            width = dz.shape[-1]
            kernel = weights[2 * i]
            if width is not None and width <= 8:  # narrow layer (the Q head): skip XLA's slow skinny dots
                grads[2 * i] = tf.stack([_batch_sum(hidden[i] * dz[:, a : a + 1]) for a in range(width)], axis=1)
            else:
                grads[2 * i] = tf.matmul(hidden[i], dz, transpose_a=True)
            grads[2 * i + 1] = _batch_sum(dz)
            if i > 0:
                if width is not None and width <= 8:
                    dz = tf.add_n([dz[:, a : a + 1] * kernel[:, a] for a in range(width)]) if width > 1 else dz * kernel[:, 0]
                else:
                    dz = tf.matmul(dz, kernel, transpose_b=True)
        return loss, tf.reduce_mean(q_taken), grads

    def apply_adam(grads, iteration):
        if clip is not None:  # tf.clip_by_global_norm's arithmetic
            norm = tf.sqrt(tf.add_n([_sum_of_squares(g) for g in grads]))
            scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
            grads = [g * scale for g in grads]
        # tf_keras Adam.update_step, dense branch.
        local_step = tf.cast(iteration + 1, tf.float32)
        beta_1_power = tf.pow(tf.constant(beta_1, tf.float32), local_step)
        beta_2_power = tf.pow(tf.constant(beta_2, tf.float32), local_step)
        lr = tf.cast(optimizer.learning_rate, tf.float32)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        for var, m_var, v_var, g in zip(params, momentums, velocities, grads):
            m = m_var + (g - m_var) * (1 - beta_1)
            v = v_var + (tf.square(g) - v_var) * (1 - beta_2)
            m_var.assign(m)
            v_var.assign(v)
            var.assign(var - (m * alpha) / (tf.sqrt(v) + epsilon))

    @tf.function(jit_compile=cfg.jit_compile, reduce_retracing=True, autograph=False)
    def update(obs, actions, rewards, next_obs, discounts):
        k_steps = tf.shape(obs)[0]
        batch = tf.shape(obs)[1]
        flat_next = tf.reshape(next_obs, tf.concat([[k_steps * batch], tf.shape(next_obs)[2:]], 0))
        next_q = tf.reshape(target(flat_next, training=False), [k_steps, batch, -1])
        all_targets = rewards + discounts * tf.reduce_max(next_q, axis=-1)
        onehots = tf.one_hot(actions, n_actions, dtype=tf.float32)
        obs = tf.cast(obs, tf.float32)
        next_obs = tf.cast(next_obs, tf.float32)
        iteration0 = optimizer.iterations.read_value()

        def body(k, total_loss, total_q):
            weights = [p.read_value() for p in params]
            if cfg.double_dqn:  # the online network as it is at this step picks, the target values
                next_actions = tf.argmax(forward(weights, next_obs[k])[-1], axis=-1, output_type=tf.int32)
                td_target = rewards[k] + discounts[k] * tf.gather(next_q[k], next_actions, batch_dims=1)
            else:
                td_target = all_targets[k]
            loss, q_mean, grads = gradients(weights, obs[k], onehots[k], td_target)
            apply_adam(grads, iteration0 + tf.cast(k, iteration0.dtype))
            return k + 1, total_loss + loss, total_q + q_mean

        _, total_loss, total_q = tf.while_loop(
            lambda k, *_: k < k_steps, body, (tf.constant(0), tf.constant(0.0), tf.constant(0.0))
        )
        optimizer.iterations.assign_add(tf.cast(k_steps, optimizer.iterations.dtype))
        steps = tf.cast(k_steps, tf.float32)
        return total_loss / steps, total_q / steps

    return update


def make_soft_update_fn(model: tf_keras.Model, target: tf_keras.Model) -> Any:
    """target <- tau * online + (1 - tau) * target, over all weights."""

    @tf.function
    def soft_update(tau):
        for online_var, target_var in zip(model.weights, target.weights):
            target_var.assign(tau * online_var + (1.0 - tau) * target_var)

    return soft_update


# ---------------------------------------------------------------------------------------------
# Checkpoints: a directory per checkpoint, written under a temporary name and renamed.
# ---------------------------------------------------------------------------------------------


class TrainingDiverged(UserError):
    """Non-finite loss or Q-values: the recipe's hyperparameters, not a bug, so a one-line error."""


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    pointer = ckpt_dir / "latest"
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


# ---------------------------------------------------------------------------------------------
# One training phase, shared by the DQN loop and offline distillation
# ---------------------------------------------------------------------------------------------


def run_updates(trainer: Any, update: Any, arrays: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """Run the K gradient steps stacked in `arrays` (leading axis K) and return (loss, q_mean).

    One fused call unless a hook needs to run before every gradient step (tfmot pruning), in
    which case the steps run one call each with the hooks in between. Advances
    trainer.gradient_step and refuses a non-finite loss.
    """
    k_steps = len(arrays[0])
    hooks = trainer.hooks
    if any(h.per_gradient_step for h in hooks):
        losses, qs = [], []
        for k in range(k_steps):
            for hook in hooks:
                hook.on_gradient_step(trainer)
            loss_t, q_t = update(*(a[k : k + 1] for a in arrays))
            losses.append(float(loss_t))
            qs.append(float(q_t))
            trainer.gradient_step += 1
        loss, q_mean = float(np.mean(losses)), float(np.mean(qs))
    else:
        loss_t, q_t = update(*arrays)
        loss, q_mean = float(loss_t), float(q_t)
        trainer.gradient_step += k_steps
    if not (np.isfinite(loss) and np.isfinite(q_mean)):
        what = f"loss {loss}" if not np.isfinite(loss) else f"mean Q-value {q_mean}"
        ckpt_dir = getattr(trainer, "ckpt_dir", None)
        kept = latest_checkpoint(ckpt_dir) if ckpt_dir is not None else None
        where = f"; the last good checkpoint is kept in {kept}" if kept is not None else ""
        raise TrainingDiverged(
            f"[{trainer.label}] training diverged: {what} at env step {trainer.step} (gradient step "
            f"{trainer.gradient_step}); lower the learning rate or set max_grad_norm{where}"
        )
    return loss, q_mean


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------


class DQNTrainer:
    """Trains one Q-network on one environment; resumable from its checkpoint directory."""

    def __init__(
        self,
        train: TrainConfig,
        env: EnvConfig,
        replay: ReplayConfig | None = None,
        seed: int = 0,
        ckpt_dir: Path | None = None,
        tb_dir: Path | None = None,
        hooks: tuple[TrainHooks, ...] = (),
        label: str = "train",
        quiet: bool = False,
        initial_model: tf_keras.Model | None = None,
        initial_replay: ReplayBuffer | None = None,
        frozen_target: list[np.ndarray] | None = None,
        device: str = "auto",
        target_template: tf_keras.Model | None = None,
    ) -> None:
        """initial_model/initial_replay/frozen_target turn this into a TD fine-tune of an
        existing (possibly tfmot-wrapped) model that keeps the baseline's buffer and target."""
        self.cfg, self.env_cfg, self.replay_cfg = train, env, replay or ReplayConfig()
        self.seed, self.ckpt_dir, self.tb_dir = seed, ckpt_dir, tb_dir
        self.hooks, self.label, self.quiet = hooks, label, quiet
        self.initial_model, self.initial_replay, self.frozen_target = initial_model, initial_replay, frozen_target
        self.device_request = device
        self.target_template = target_template
        self.notes: list[str] = []  # said once the progress display is up
        self.step = 0
        self.gradient_step = 0
        self.episodes = 0

    # -- set-up --------------------------------------------------------------------------------

    def _build(self) -> None:
        configure_threads(self.cfg.intra_op_threads)
        self.device = configure_device(self.device_request)
        self.cfg = self.cfg.model_copy(update={"jit_compile": use_xla(self.cfg.jit_compile, bool(self.cfg.conv))})
        cfg = self.cfg
        set_seed(self.seed)
        self.env = make_env_from(self.env_cfg)
        self.info = env_info(self.env, self.env_cfg.id)
        # Independent streams for exploration and replay sampling (not two generators of one seed).
        acting_seed, replay_seed = np.random.SeedSequence(self.seed).spawn(2)
        if self.initial_replay is not None:
            self.replay = self.initial_replay
        else:
            self.replay = ReplayBuffer(
                replay_capacity(cfg, self.replay_cfg, self.info), self.info.obs_shape, self.info.obs_dtype,
                self.info.n_actions, replay_seed, frame_stack=self.info.frame_stack,
            )
        self.dtype_policy = mixed_precision_policy(cfg.mixed_precision, self.device)
        if cfg.mixed_precision and self.dtype_policy != "mixed_float16":
            self.notes.append("mixed_precision needs a GPU; training in float32 on the CPU")
        previous_policy = tf_keras.mixed_precision.global_policy()
        tf_keras.mixed_precision.set_global_policy(self.dtype_policy)
        try:
            if self.initial_model is not None:
                self.model = self.initial_model
            else:
                self.model = network_for(self.info, cfg)
            if self.target_template is not None:  # a fine-tune of a network not built from cfg
                self.target = tf_keras.models.clone_model(self.target_template)
            else:
                self.target = network_for(self.info, cfg, name="target")
        finally:
            tf_keras.mixed_precision.set_global_policy(previous_policy)
        self.target.set_weights(self.frozen_target if self.frozen_target is not None else self.model.get_weights())
        self.optimizer = tf_keras.optimizers.Adam(cfg.learning_rate)
        if self.dtype_policy == "mixed_float16":
            self.optimizer = tf_keras.mixed_precision.LossScaleOptimizer(self.optimizer)
        self.optimizer.build(self.model.trainable_variables)
        self.update = make_update_fn(self.model, self.target, self.optimizer, cfg)
        self.soft_update = make_soft_update_fn(self.model, self.target)
        self.actor = make_actor(self.model)
        self.rng = np.random.default_rng(acting_seed)
        self.pending_target_updates = 0
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.episode_returns: list[float] = []
        self.best_return: float | None = None
        self.best_step: int | None = None
        self.best_weights: list[np.ndarray] | None = None
        self.next_checkpoint = self.cfg.checkpoint_interval
        self.next_eval = self.cfg.eval_interval or None
        self.elapsed_before = 0.0
        self.writer = tf.summary.create_file_writer(str(self.tb_dir)) if self.tb_dir else None

    # -- checkpoints ---------------------------------------------------------------------------

    def _flush_target(self) -> None:
        """Apply pending target updates in closed form: n Polyak steps of tau = one of 1-(1-tau)^n."""
        if self.frozen_target is not None:
            self.pending_target_updates = 0
        if self.pending_target_updates:
            tau = 1.0 - (1.0 - self.cfg.tau) ** self.pending_target_updates
            if tau >= 1.0:
                self.target.set_weights(self.model.get_weights())
            else:
                self.soft_update(tf.constant(tau, tf.float32))
            self.pending_target_updates = 0

    def save_checkpoint(self) -> Path:
        assert self.ckpt_dir is not None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        name = f"step-{self.step:09d}"
        tmp = self.ckpt_dir / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self._write_checkpoint(tmp)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint stays as it was
            previous = latest_checkpoint(self.ckpt_dir)
            kept = f"the last good checkpoint ({previous.name}) is intact" if previous else "no checkpoint was complete"
            raise UserError(
                f"cannot write checkpoint {name} in {self.ckpt_dir} ({exc.strerror or exc}); {kept}; "
                "free disk space and rerun the same command to resume"
            ) from None
        final = self.ckpt_dir / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        previous = latest_checkpoint(self.ckpt_dir)
        write_text_atomic(self.ckpt_dir / "latest", name)
        if previous is not None and previous != final:
            shutil.rmtree(previous, ignore_errors=True)
        return final

    def _write_checkpoint(self, tmp: Path) -> None:
        tmp.mkdir()
        save_arrays(tmp / "model.npz", self.model.get_weights())
        save_arrays(tmp / "target.npz", self.target.get_weights())
        save_arrays(tmp / "optimizer.npz", [v.numpy() for v in self.optimizer.variables()])
        save_arrays(tmp / "replay.npz", self.replay.state_dict())
        if self.best_weights is not None:
            save_arrays(tmp / "best.npz", self.best_weights)
        state = {
            "step": self.step,
            "gradient_step": self.gradient_step,
            "episodes": self.episodes,
            "pending_target_updates": self.pending_target_updates,
            "next_checkpoint": self.next_checkpoint,
            "next_eval": self.next_eval,
            "best_return": self.best_return,
            "best_step": self.best_step,
            "episode_returns": self.episode_returns,
            "elapsed": self.elapsed_before + (time.perf_counter() - self._t0),
            "rng": json.dumps(self.rng.bit_generator.state),
            "env_rng": rng_state(self.env),
        }
        write_text_atomic(tmp / "state.json", json.dumps(state))

    def _restore(self, path: Path) -> None:
        state = json.loads((path / "state.json").read_text())
        self.model.set_weights(load_arrays(path / "model.npz"))
        self.target.set_weights(load_arrays(path / "target.npz"))
        for var, value in zip(self.optimizer.variables(), load_arrays(path / "optimizer.npz")):
            var.assign(value)
        self.replay.load_state_dict(load_dict(path / "replay.npz"))
        if (path / "best.npz").exists():
            self.best_weights = load_arrays(path / "best.npz")
        self.step, self.gradient_step, self.episodes = state["step"], state["gradient_step"], state["episodes"]
        self.pending_target_updates = state["pending_target_updates"]
        self.next_checkpoint, self.next_eval = state["next_checkpoint"], state["next_eval"]
        self.best_return, self.best_step = state["best_return"], state["best_step"]
        self.episode_returns = state["episode_returns"]
        self.recent_returns.extend(self.episode_returns[-20:])
        self.elapsed_before = state["elapsed"]
        bit_generator = np.random.PCG64()
        bit_generator.state = json.loads(state["rng"])
        self.rng = np.random.Generator(bit_generator)
        set_rng_state(self.env, state["env_rng"])
        self.actor.refresh()

    # -- evaluation for model selection --------------------------------------------------------

    def _periodic_eval(self) -> None:
        seeds = range(self.cfg.eval_seed, self.cfg.eval_seed + self.cfg.eval_episodes)
        returns = run_episodes(self.actor.act, self.env_cfg, seeds)
        mean = float(np.mean(returns))
        self.recent_eval = mean
        self._scalar("eval/mean_return", mean)
        if self.best_return is None or mean >= self.best_return:
            self.best_return, self.best_step = mean, self.step
            self.best_weights = self.model.get_weights()
        self.progress.message(
            f"[{self.label}] step {self.step}: eval return {mean:.1f} (best {self.best_return:.1f} at {self.best_step})"
        )

    def _scalar(self, name: str, value: float) -> None:
        if self.writer is not None:
            with self.writer.as_default():
                tf.summary.scalar(name, value, step=self.step)

    # -- the loop ------------------------------------------------------------------------------

    def _train_phase(self) -> tuple[float, float]:
        cfg = self.cfg
        self._flush_target()
        if cfg.learning_rate_schedule == "linear":  # SB3: set from the progress left before each phase
            self.optimizer.learning_rate.assign(cfg.learning_rate * (1.0 - self.step / cfg.total_timesteps))
        k_steps, batch = cfg.gradient_steps, cfg.batch_size
        idx = self.replay.sample_indices(k_steps * batch)
        b = self.replay.gather_n_step(idx, cfg.n_steps, cfg.gamma)

        def stack(x: np.ndarray) -> np.ndarray:
            return x.reshape((k_steps, batch) + x.shape[1:])

        obs, next_obs = stack(b.observations), stack(b.next_observations)
        actions = stack(b.actions.astype(np.int32))
        rewards, discounts = stack(b.rewards), stack(b.discounts)
        loss, q_mean = run_updates(self, self.update, (obs, actions, rewards, next_obs, discounts))
        self.actor.refresh()
        for hook in self.hooks:
            hook.on_phase_end(self)
        return loss, q_mean

    def train(self) -> TrainResult:
        """Run (or resume) training to cfg.total_timesteps and return the kept model."""
        cfg = self.cfg
        self._build()
        resumed_from = None
        ckpt = latest_checkpoint(self.ckpt_dir) if self.ckpt_dir else None
        self._t0 = time.perf_counter()
        if ckpt is not None:
            self._restore(ckpt)
            resumed_from = self.step
            obs, _ = self.env.reset()
        else:
            obs = seed_env(self.env, self.seed)
        self.progress = Progress(self.label, cfg.total_timesteps, self.step, self.quiet)
        if resumed_from is not None:
            self.progress.message(f"[{self.label}] resuming from checkpoint at step {resumed_from}")
        for note in self.notes:
            self.progress.message(f"[{self.label}] {note}")
        for hook in self.hooks:
            hook.on_train_begin(self)
        episode_return, episode_len = 0.0, 0
        start_step = self.step
        try:
            while self.step < cfg.total_timesteps:
                # 1. Act: uniformly at random until learning_starts (as SB3), then epsilon-greedy.
                if self.step < cfg.learning_starts or self.rng.random() < linear_epsilon(self.step, cfg):
                    action = int(self.rng.integers(self.info.n_actions))
                else:
                    action = self.actor.act(obs)
                next_obs, reward, terminated, truncated, _ = self.env.step(action)
                self.replay.add(obs, action, reward, next_obs, terminated, truncated)
                obs = next_obs
                episode_return += float(reward)
                episode_len += 1
                self.step += 1
                # 2. Target updates are counted in env steps (as in SB3) and applied lazily.
                if self.step % cfg.target_update_interval == 0:
                    self.pending_target_updates += 1
                # 3. Train every train_freq steps once learning_starts have passed.
                if self.step % cfg.train_freq == 0 and self.step > cfg.learning_starts:
                    loss, q_mean = self._train_phase()
                    self._scalar("train/loss", loss)
                    self._scalar("train/q_mean", q_mean)
                    self._scalar("train/epsilon", linear_epsilon(self.step, cfg))
                    self.progress.update(self.step, float(np.mean(self.recent_returns)) if self.recent_returns else None)
                if self.next_eval is not None and self.step >= self.next_eval:
                    self._periodic_eval()
                    self.next_eval += cfg.eval_interval
                # 4. Episode end: log, reset, and checkpoint here (resume is exact at episode ends).
                if terminated or truncated:
                    self.episodes += 1
                    self.episode_returns.append(episode_return)
                    self.recent_returns.append(episode_return)
                    self._scalar("train/episode_return", episode_return)
                    self._scalar("train/episode_length", episode_len)
                    episode_return, episode_len = 0.0, 0
                    if self.ckpt_dir is not None and self.step >= self.next_checkpoint:
                        while self.next_checkpoint <= self.step:
                            self.next_checkpoint += cfg.checkpoint_interval
                        self.save_checkpoint()
                    obs, _ = self.env.reset()
            if self.next_eval is not None and (self.best_step is None or self.best_step < self.step):
                self._periodic_eval()  # the final weights are a candidate too
        finally:
            self.progress.update(self.step, float(np.mean(self.recent_returns)) if self.recent_returns else None)
            self.progress.close()
            if self.writer is not None:
                self.writer.flush()
        self._flush_target()
        for hook in self.hooks:
            hook.on_train_end(self)
        wall = self.elapsed_before + (time.perf_counter() - self._t0)
        run_seconds = time.perf_counter() - self._t0
        if self.best_weights is not None:
            self.model.set_weights(self.best_weights)
        self.env.close()
        return TrainResult(
            model=self.model,
            replay=self.replay,
            info=self.info,
            env_steps=self.step,
            gradient_steps=self.gradient_step,
            episodes=self.episodes,
            wall_seconds=wall,
            env_steps_per_second=(self.step - start_step) / run_seconds if run_seconds > 0 else 0.0,
            resumed_from=resumed_from,
            selected_step=self.best_step,
            selected_return=self.best_return,
            episode_returns=list(self.episode_returns),
        )
