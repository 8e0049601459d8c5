"""Q-value distillation: a student regresses the frozen baseline's Q-values on replay states.

Offline (no environment steps) and cheap: the teacher's Q-values come from a numpy forward pass.
A smaller student is the variant that makes inference actually faster, since sparse Dense
layers get no speed-up in TFLite/XNNPACK; it composes with quantization.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from compress_dqn._tf import tf, tf_keras
from compress_dqn.envs.environment import EnvInfo, make_env_from, seed_env
from compress_dqn.errors import UserError
from compress_dqn.progress import Progress
from compress_dqn.recipe.schema import FineTuneConfig, StudentConfig
from compress_dqn.replay.buffer import ReplayBuffer
from compress_dqn.rl.callbacks import LoopCallbacks
from compress_dqn.rl.networks import KerasActor, NumpyActor, make_actor, network_for, q_from_outputs
from compress_dqn.rl.train_state import TrainState
from compress_dqn.rl.updates import UpdateFn, run_updates


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
    advantage_weight: float = 0.0,
    advantage_scale: float = 1.0,
    margin_weight: float = 0.0,
) -> UpdateFn:
    """`update(obs, teacher_q)` over K stacked batches: K steps; returns (mean loss, mean Q).

    loss="mse" regresses all Q-values. A DQN's action gaps are tiny next to its Q-values
    (CartPole: median gap ~0.06 on Q ~100), so a small MSE can still flip most greedy actions.
    loss="policy" is policy distillation (Rusu et al., 2016): KL between the teacher's and the
    student's softmax(Q / temperature), which ranks actions wherever their gap exceeds the
    temperature, plus the Q-values' squared error divided by their variance (value_scale). The
    second term keeps outputs on the Q scale: with near-hard targets, KL alone keeps widening
    the student's gaps (its Q errors grow large), which then ruins int8 ranges.

    advantage_weight adds the advantages' (Q - mean_a Q) squared error over their variance
    (advantage_scale). The Q term's scale is the Q-values' spread across states, far wider than the
    gaps between actions, so without it a student may rank actions right with gaps several times
    smaller than the teacher's, which int8 rounding then flips.
    """
    objective = _distill_objective(loss, temperature, value_scale, advantage_weight, advantage_scale, margin_weight)

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


def _distill_objective(loss: str, temperature: float, value_scale: float, advantage_weight: float,
                       advantage_scale: float, margin_weight: float = 0.0) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """The loss of a batch of student Q-values against the teacher's (make_distill_update_fn says why each term)."""
    tau = tf.constant(temperature, tf.float32)
    inv_var = tf.constant(1.0 / max(value_scale, 1e-8), tf.float32)
    adv_weight = tf.constant(advantage_weight / max(advantage_scale, 1e-8), tf.float32)
    hinge_weight = tf.constant(margin_weight / max(advantage_scale, 1e-8) ** 0.5, tf.float32)

    def objective(q: tf.Tensor, teacher: tf.Tensor) -> tf.Tensor:
        if loss == "mse":
            return tf.reduce_mean(tf.square(q - teacher))
        p_teacher = tf.nn.softmax(teacher / tau)
        kl = tf.reduce_sum(
            p_teacher * (tf.nn.log_softmax(teacher / tau) - tf.nn.log_softmax(q / tau)), axis=-1
        )
        total = tf.reduce_mean(kl) + inv_var * tf.reduce_mean(tf.square(q - teacher))
        if advantage_weight:
            advantage_error = (q - tf.reduce_mean(q, axis=-1, keepdims=True)) - (
                teacher - tf.reduce_mean(teacher, axis=-1, keepdims=True))
            total += adv_weight * tf.reduce_mean(tf.square(advantage_error))
        if margin_weight:
            total += hinge_weight * tf.reduce_mean(_margin_shortfall(q, teacher))
        return total

    return objective


def _margin_shortfall(q: tf.Tensor, teacher: tf.Tensor) -> tf.Tensor:
    """Per state: max(0, teacher's lead - the student's lead of the teacher's best action over the
    student's best other action). Zero where the student ranks that action first by at least the
    teacher's gap."""
    top2 = tf.math.top_k(teacher, k=2).values
    best = tf.argmax(teacher, axis=-1)
    chosen = tf.gather(q, best, batch_dims=1)
    others = tf.where(tf.one_hot(best, tf.shape(q)[-1]) > 0, tf.fill(tf.shape(q), -float("inf")), q)
    return tf.nn.relu((top2[:, 0] - top2[:, 1]) - (chosen - tf.reduce_max(others, axis=-1)))


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


SIDE_BY_SIDE = 8
"""Episodes a costly-per-call student plays at once for its DAgger states: a QAT student's Keras
call took ~1.5 ms a step at batch 1, most of a QAT fine-tune's time, and about the same at 8."""


class StudentStates:
    """States the student visits, labelled with the teacher's Q-values (DAgger; Ross et al., 2011).

    Replay holds the states the teacher's training visited. A student that errs drifts to states
    the teacher rarely saw, where nothing taught it what to do, and errs more: imitation's
    compounding error. Playing the student and asking the teacher about the states it reached
    teaches it exactly there. The environment is seeded from the fine-tune's own seed, so its
    episodes are not the evaluation's (those are reset with explicit seeds).
    """

    def __init__(self, env: Any, seed: int, steps: int, plays: int, obs_shape: tuple[int, ...], n_actions: int,
                 obs_dtype: np.dtype = np.dtype(np.float32)) -> None:
        """steps: environment steps per play; plays: how many (the arrays hold them all). States
        are kept as the environment gives them (a uint8 image stays uint8: 4x less memory than float)."""

        self.steps = steps
        capacity = steps * plays
        self.env = make_env_from(env)
        self.obs = seed_env(self.env, seed)
        if tuple(np.shape(self.obs)) != tuple(obs_shape):
            raise UserError(f"fine_tune.student_states: the environment gives observations of shape {np.shape(self.obs)}, "
                            f"the network takes {tuple(obs_shape)}; check env.frame_stack")
        self.states = np.zeros((capacity, *obs_shape), obs_dtype)
        self.teacher_q = np.zeros((capacity, n_actions), np.float32)
        self.size = 0
        self.rng = np.random.default_rng(seed)
        self.env_config, self.seed = env, seed
        self.lanes: list[tuple[Any, np.ndarray]] = []

    def collect(self, student: NumpyActor | KerasActor, teacher: NumpyActor | KerasActor) -> None:
        """Play the student greedily for one play's environment steps (across episodes); label the
        states. A student whose every call costs about the same at any batch (a Keras model: a
        QAT or pruning-wrapped student) plays SIDE_BY_SIDE episodes at once, one call a step for
        all of them."""
        steps = min(self.steps, len(self.states) - self.size)
        start = self.size
        if isinstance(student, KerasActor):
            self._side_by_side(student, start, steps)
        else:
            for i in range(steps):
                self.states[start + i] = self.obs
                self.obs, _, terminated, truncated, _ = self.env.step(student.act(self.obs))
                if terminated or truncated:
                    self.obs, _ = self.env.reset()
        self.teacher_q[start:start + steps] = teacher.q_values(self.states[start:start + steps])
        self.size += steps

    def _side_by_side(self, student: KerasActor, start: int, steps: int) -> None:
        """Rows start..start+steps from SIDE_BY_SIDE environments stepped together (the first is the
        one the cheap path plays; each goes on with its episode at the next play)."""
        if not self.lanes:
            seeds = np.random.SeedSequence(self.seed).generate_state(SIDE_BY_SIDE - 1)
            self.lanes = [(self.env, self.obs)]
            for lane_seed in seeds:
                env = make_env_from(self.env_config)
                self.lanes.append((env, seed_env(env, int(lane_seed % 2**31))))
        row = start
        while row < start + steps:
            lanes = self.lanes[:start + steps - row]
            observations = np.stack([obs for _, obs in lanes])
            self.states[row:row + len(lanes)] = observations
            actions = np.argmax(student.q_values(observations), axis=1)
            for i, ((env, _), action) in enumerate(zip(lanes, actions)):
                obs, _, terminated, truncated, _ = env.step(int(action))
                self.lanes[i] = (env, env.reset()[0] if terminated or truncated else obs)
            row += len(lanes)
        self.obs = self.lanes[0][1]

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.rng.integers(0, self.size, n)
        return self.states[rows], self.teacher_q[rows]

    def close(self) -> None:
        for env in [self.env, *(env for env, _ in self.lanes[1:])]:  # lanes[0] plays self.env
            env.close()


class Distiller:
    """Offline distillation through the training loop's phase runner and callbacks.

    Each phase samples K*B replay observations, looks up (or computes, in numpy) the teacher's
    Q-values, and runs K gradient steps (fused, or one by one when a callback has batch hooks).
    With student_states, half of every batch comes from states the student played (StudentStates).
    """

    ckpt_dir: Path | None = None  # nothing to resume: distillation is short and offline

    def __init__(
        self,
        student: tf_keras.Model,
        teacher: tf_keras.Model,
        replay: ReplayBuffer,
        ft: FineTuneConfig,
        max_grad_norm: float | None = 10.0,
        jit_compile: bool = True,
        label: str = "distill",
        quiet: bool = False,
        phase_steps: int = 100,
        callbacks: Sequence[tf_keras.callbacks.Callback] = (),
        env: Any = None,
        seed: int = 0,
    ) -> None:
        """`ft` gives the steps, learning rate and its schedule, batch size, loss, temperature and
        student states; the rest is how the loop runs (the recipe's train block and the build's)."""
        steps, learning_rate, batch_size = ft.steps, ft.learning_rate, ft.batch_size
        self.student, self.replay, self.steps = student, replay, steps
        self.batch_size, self.label, self.quiet = batch_size, label, quiet
        self.phase_steps = phase_steps
        self.state = TrainState()
        self.callbacks = LoopCallbacks(callbacks, student)
        self.teacher = make_actor(teacher)
        if ft.learning_rate_schedule == "linear":  # to 0 at the last step (the optimizer counts its steps)
            learning_rate = tf_keras.optimizers.schedules.PolynomialDecay(learning_rate, steps, 0.0)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate)
        self.optimizer.build(student.trainable_variables)
        # The Q-value term is scaled by the variance of the teacher's Q-values over replay states.
        probe = replay.sample_observations(min(10_000, 20 * batch_size))
        probe_q = self.teacher.q_values(probe)
        value_scale = float(probe_q.var())
        advantage_scale = float((probe_q - probe_q.mean(axis=1, keepdims=True)).var())
        self.teacher_q = teacher_table(self.teacher, replay, steps * batch_size)
        self.played: StudentStates | None = None
        # The student plays after every interval of training (not before: an untrained student's states teach little).
        interval = ft.student_states_interval
        self.rounds = list(range(interval, steps, interval)) if ft.student_states else []
        if self.rounds:
            if env is None:
                raise ValueError("student_states: the student needs an environment (env) to play in")
            # The environment is built as training built it (frame stack included), so its
            # observations are what the network takes, images or flat.
            self.played = StudentStates(env, seed, ft.student_states, len(self.rounds), replay.obs_shape,
                                        replay.n_actions, replay.obs_dtype)
        self.update = make_distill_update_fn(
            student, self.optimizer, max_grad_norm, jit_compile, ft.loss, ft.temperature, value_scale,
            ft.advantage_weight, advantage_scale, ft.margin_weight,
        )

    def run(self) -> float:
        """Train the student for `steps` gradient steps; returns the last phase's mean loss."""
        state = self.state
        progress = Progress(self.label, self.steps, 0, self.quiet)
        self.callbacks.on_train_begin()
        loss = float("nan")
        try:
            while state.gradient_step < self.steps:
                if self.rounds and state.gradient_step >= self.rounds[0]:
                    self.rounds.pop(0)
                    self.played.collect(make_actor(self.student), self.teacher)
                k = min(self.phase_steps, self.steps - state.gradient_step)
                if self.rounds:  # a phase ends where the student plays next
                    k = min(k, self.rounds[0] - state.gradient_step)
                obs, teacher_q = self._batches(k)
                loss, q_mean = run_updates(self, self.update, (obs, teacher_q))
                state.step = state.gradient_step
                self.callbacks.on_phase_end({"step": state.step, "gradient_step": state.gradient_step,
                                             "loss": loss, "q_mean": q_mean})
                progress.update(state.step, None)
        finally:
            progress.close()
            if self.played is not None:
                self.played.close()
        self.callbacks.on_train_end({"step": state.step, "gradient_step": state.gradient_step})
        return loss

    def _batches(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """K batches of (observations, teacher Q-values): replay states, and where the student has
        played, half of each batch from its states."""
        from_played = self.batch_size // 2 if self.played is not None and self.played.size else 0
        from_replay = self.batch_size - from_played
        rows = self.replay.sample_indices(k * from_replay)
        obs = self.replay.observations_at(rows)
        teacher_q = self.teacher_q[rows] if self.teacher_q is not None else self.teacher.q_values(obs)
        obs, teacher_q = obs.reshape((k, from_replay) + obs.shape[1:]), teacher_q.reshape(k, from_replay, -1)
        if from_played:
            played_obs, played_q = self.played.sample(k * from_played)
            obs = np.concatenate([obs, played_obs.astype(obs.dtype).reshape((k, from_played) + obs.shape[2:])], axis=1)
            teacher_q = np.concatenate([teacher_q, played_q.reshape(k, from_played, -1)], axis=1)
        return obs, teacher_q
