"""The DQN update hand-derived for the common case, a Dense MLP trained with tf_keras Adam, for speed.

Same math as the generic update (updates.py): the same TD loss and its exact gradient
(backpropagated with explicit matmuls), tf.clip_by_global_norm's scaling, and tf_keras Adam's
update of the optimizer's own slots and iteration counter, one gradient step after another. Only
summation orders differ (float32 round-off, ~1e-7 relative); tests/test_train.py pins the two
paths together. It exists only because XLA on CPU runs it faster than the GradientTape path
(recipes/cartpole-zoo.yaml trains faster: docs/training-cartpole.md); delete it once that stops being true.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compress_dqn._tf import tf, tf_keras
from compress_dqn.recipe.schema import TrainConfig

UpdateFn = Callable[..., tuple[tf.Tensor, tf.Tensor]]
"""update(*arrays) over arrays with a leading phase axis K: runs K gradient steps, returns (mean loss, mean Q).

Defined here, the lower of the two update modules, so that updates.py imports it without a circle."""

_ACTIVATIONS = ("relu", "linear")


def make_update_fn(
    model: tf_keras.Model, target: tf_keras.Model, optimizer: tf_keras.optimizers.Optimizer, cfg: TrainConfig,
) -> UpdateFn | None:
    """The hand-derived `update` (same contract as updates.make_update_fn), or None where it would
    not compute exactly what the generic update does (other layers, wrappers, optimizers)."""
    if not (_plain_mlp(model, cfg) and _plain_adam(optimizer, model)):
        return None
    return _MlpAdam(model, optimizer, cfg).update_fn(target)


def _plain_mlp(model: Any, cfg: TrainConfig) -> bool:
    """A Sequential of trainable float32 Dense layers (relu/linear, biases, no constraints), flat input."""
    if cfg.loss not in ("huber", "mse") or not isinstance(model, tf_keras.Sequential) or not model.layers:
        return False
    expected = []
    for layer in model.layers:
        if type(layer) is not tf_keras.layers.Dense or not layer.use_bias or not layer.trainable:
            return False
        if getattr(layer.activation, "__name__", None) not in _ACTIVATIONS:
            return False
        if layer.kernel_constraint is not None or layer.bias_constraint is not None:
            return False
        if layer.dtype_policy.compute_dtype != "float32" or layer.kernel.dtype != tf.float32:
            return False
        expected += [layer.kernel, layer.bias]
    return len(model.input_shape) == 2 and [id(v) for v in model.trainable_variables] == [id(v) for v in expected]


def _plain_adam(optimizer: Any, model: Any) -> bool:
    """tf_keras Adam without amsgrad, EMA, weight decay, clipping or a schedule, built for the model."""
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
        return all(optimizer._var_key(v) in optimizer._index_dict for v in model.trainable_variables)
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


class _MlpAdam:
    """The forward pass, backward pass and Adam step of one model and its optimizer's slots."""

    def __init__(self, model: tf_keras.Sequential, optimizer: tf_keras.optimizers.Adam, cfg: TrainConfig) -> None:
        self.optimizer, self.cfg = optimizer, cfg
        self.activations = [layer.activation.__name__ for layer in model.layers]
        self.params = [v for layer in model.layers for v in (layer.kernel, layer.bias)]
        slots = [optimizer._index_dict[optimizer._var_key(v)] for v in self.params]
        self.momentums = [optimizer._momentums[i] for i in slots]
        self.velocities = [optimizer._velocities[i] for i in slots]
        self.betas = float(optimizer.beta_1), float(optimizer.beta_2)
        self.epsilon = float(optimizer.epsilon)
        self.n_actions = int(self.params[-1].shape[0])

    def forward(self, weights: list[tf.Tensor], x: tf.Tensor) -> list[tf.Tensor]:
        """Every layer's input, then the Q-values: [x, h1, ..., q]."""
        hidden = [x]
        for i, act in enumerate(self.activations):
            x = tf.matmul(x, weights[2 * i]) + weights[2 * i + 1]
            if act == "relu":
                x = tf.nn.relu(x)
            hidden.append(x)
        return hidden

    def gradients(self, weights: list[tf.Tensor], obs: tf.Tensor, onehot: tf.Tensor, td_target: tf.Tensor) -> tuple:
        """(loss, mean Q taken, the loss's gradient for every weight), backpropagated by hand."""
        hidden = self.forward(weights, obs)  # hidden[i] is the input of layer i
        q_taken = tf.reduce_sum(hidden[-1] * onehot, axis=-1)
        error = td_target - q_taken
        batch = tf.cast(tf.shape(error)[0], tf.float32)
        if self.cfg.loss == "huber":
            abs_error = tf.abs(error)
            loss = tf.reduce_mean(tf.where(abs_error < 1.0, 0.5 * tf.square(error), abs_error - 0.5))
            d_error = tf.where(abs_error < 1.0, error, tf.sign(error)) / batch
        else:
            loss = tf.reduce_mean(tf.square(error))
            d_error = 2.0 * error / batch
        dz = onehot * (-d_error)[:, None]  # d loss / d pre-activation of the last layer
        grads: list[Any] = [None] * len(weights)
        for i in reversed(range(len(self.activations))):
            if self.activations[i] == "relu":
                dz = tf.where(hidden[i + 1] > 0, dz, tf.zeros_like(dz))
            width, kernel = dz.shape[-1], weights[2 * i]
            narrow = width is not None and width <= 8  # the Q head: skip XLA's slow skinny dots
            if narrow:
                grads[2 * i] = tf.stack([_batch_sum(hidden[i] * dz[:, a : a + 1]) for a in range(width)], axis=1)
            else:
                grads[2 * i] = tf.matmul(hidden[i], dz, transpose_a=True)
            grads[2 * i + 1] = _batch_sum(dz)
            if i > 0 and narrow:
                dz = tf.add_n([dz[:, a : a + 1] * kernel[:, a] for a in range(width)]) if width > 1 else dz * kernel[:, 0]
            elif i > 0:
                dz = tf.matmul(dz, kernel, transpose_b=True)
        return loss, tf.reduce_mean(q_taken), grads

    def apply_adam(self, grads: list[tf.Tensor], iteration: tf.Tensor) -> None:
        """tf.clip_by_global_norm, then tf_keras Adam.update_step's dense branch, on the live variables."""
        clip = self.cfg.max_grad_norm
        if clip is not None:  # tf.clip_by_global_norm's arithmetic
            norm = tf.sqrt(tf.add_n([_sum_of_squares(g) for g in grads]))
            scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
            grads = [g * scale for g in grads]
        beta_1, beta_2 = self.betas
        local_step = tf.cast(iteration + 1, tf.float32)
        beta_1_power = tf.pow(tf.constant(beta_1, tf.float32), local_step)
        beta_2_power = tf.pow(tf.constant(beta_2, tf.float32), local_step)
        lr = tf.cast(self.optimizer.learning_rate, tf.float32)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        for var, m_var, v_var, g in zip(self.params, self.momentums, self.velocities, grads):
            m = m_var + (g - m_var) * (1 - beta_1)
            v = v_var + (tf.square(g) - v_var) * (1 - beta_2)
            m_var.assign(m)
            v_var.assign(v)
            var.assign(var - (m * alpha) / (tf.sqrt(v) + self.epsilon))

    def update_fn(self, target: tf_keras.Model) -> UpdateFn:
        """K gradient steps in one compiled call, the target's forward pass batched over all K."""
        cfg, optimizer, params = self.cfg, self.optimizer, self.params

        @tf.function(jit_compile=cfg.jit_compile, reduce_retracing=True, autograph=False)
        def update(obs, actions, rewards, next_obs, discounts):
            k_steps, batch = tf.shape(obs)[0], tf.shape(obs)[1]
            flat_next = tf.reshape(next_obs, tf.concat([[k_steps * batch], tf.shape(next_obs)[2:]], 0))
            next_q = tf.reshape(target(flat_next, training=False), [k_steps, batch, -1])
            all_targets = rewards + discounts * tf.reduce_max(next_q, axis=-1)
            onehots = tf.one_hot(actions, self.n_actions, dtype=tf.float32)
            obs, next_obs = tf.cast(obs, tf.float32), tf.cast(next_obs, tf.float32)
            iteration0 = optimizer.iterations.read_value()

            def body(k, total_loss, total_q):
                weights = [p.read_value() for p in params]
                if cfg.double_dqn:  # the online network as it is at this step picks, the target values
                    next_actions = tf.argmax(self.forward(weights, next_obs[k])[-1], axis=-1, output_type=tf.int32)
                    td_target = rewards[k] + discounts[k] * tf.gather(next_q[k], next_actions, batch_dims=1)
                else:
                    td_target = all_targets[k]
                loss, q_mean, grads = self.gradients(weights, obs[k], onehots[k], td_target)
                self.apply_adam(grads, iteration0 + tf.cast(k, iteration0.dtype))
                return k + 1, total_loss + loss, total_q + q_mean

            _, total_loss, total_q = tf.while_loop(
                lambda k, *_: k < k_steps, body, (tf.constant(0), tf.constant(0.0), tf.constant(0.0))
            )
            optimizer.iterations.assign_add(tf.cast(k_steps, optimizer.iterations.dtype))
            steps = tf.cast(k_steps, tf.float32)
            return total_loss / steps, total_q / steps

        return update
