"""The DQN loop: reads top to bottom like CleanRL's dqn.py, but importable and resumable.

Semantics follow Stable-Baselines3 so RL Zoo hyperparameters mean the same thing here:
training phases every `train_freq` env steps once `learning_starts` have passed, each of
`gradient_steps` updates; target updates counted in env steps. A phase is one compiled call
(updates.py) and acting runs in numpy, not eager TensorFlow, because both are what make it fast.

Checkpoints (weights, optimizer, replay, counters, RNG states; npz + JSON, no pickle) are taken
at the first episode end after each `checkpoint_interval`, so a resumed run replays exactly the
same stream as an uninterrupted one on CPU.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Sequence

import gymnasium as gym
import numpy as np

from compress_dqn._tf import (
    configure_device,
    configure_threads,
    mixed_precision_policy,
    set_seed,
    tf,
    tf_keras,
    use_xla,
)
from compress_dqn.envs.environment import EnvInfo, env_info, make_env_from, rng_state, seed_env, set_rng_state
from compress_dqn.envs.episodes import run_episodes
from compress_dqn.errors import WriteRefused
from compress_dqn.fileio import load_arrays, load_dict, refused_writes, save_arrays, write_text_atomic
from compress_dqn.progress import Progress
from compress_dqn.recipe.schema import EnvConfig, ReplayConfig, TrainConfig
from compress_dqn.replay.buffer import ReplayBuffer, build_replay
from compress_dqn.rl.callbacks import Interrupt, LoopCallbacks
from compress_dqn.rl.networks import fold_dueling, make_actor, network_for
from compress_dqn.rl.train_state import TrainState, latest_checkpoint, write_checkpoint_dir
from compress_dqn.rl.updates import TrainingDiverged, make_soft_update_fn, make_update_fn, run_updates

__all__ = [
    "DQNTrainer", "Interrupt", "RunOptions", "TrainResult", "TrainingDiverged", "latest_checkpoint", "linear_epsilon",
]


@dataclass
class TrainResult:
    """What training produced; the model holds the kept (best or last) weights, as a plain Q-network
    (a dueling network folded into one Dense head, see networks.fold_dueling)."""

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


@dataclass(frozen=True)
class RunOptions:
    """Who a run is and where it writes; how it learns is the TrainConfig."""

    env_config: EnvConfig
    """Periodic evaluations play fresh environments built from it."""
    seed: int = 0
    """Seeds the environment's first reset and the exploration stream."""
    ckpt_dir: Path | None = None
    tb_dir: Path | None = None
    label: str = "train"
    quiet: bool = False


def linear_epsilon(step: int, cfg: TrainConfig) -> float:
    """SB3's linear schedule: initial -> final over exploration_fraction of the run."""
    span = cfg.exploration_fraction * cfg.total_timesteps
    progress = 1.0 if span <= 0 else min(1.0, step / span)
    return cfg.exploration_initial_eps + progress * (cfg.exploration_final_eps - cfg.exploration_initial_eps)


def seed_streams(seed: int) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """(exploration, replay sampling): independent streams, not two generators of one seed."""
    acting, replay = np.random.SeedSequence(seed).spawn(2)
    return acting, replay


class DQNTrainer:
    """Trains a Q-network in an environment; resumable from its checkpoint directory.

    Built from ready objects (from_recipe builds them from a recipe). A fine-tune is the same
    trainer handed the model to tune, the baseline's replay, and a target its config never updates.
    """

    def __init__(
        self, model: tf_keras.Model, target: tf_keras.Model, optimizer: tf_keras.optimizers.Optimizer,
        replay: ReplayBuffer, env: gym.Env, config: TrainConfig, run: RunOptions, callbacks: Sequence[tf_keras.callbacks.Callback] = (),
    ) -> None:
        self.model, self.target, self.optimizer, self.replay, self.env = model, target, optimizer, replay, env
        self.config, self.run = config, run
        self.label, self.ckpt_dir = run.label, run.ckpt_dir
        self.info = env_info(env, run.env_config.id)
        self.state = TrainState(next_checkpoint=config.checkpoint_interval, next_eval=config.eval_interval or None)
        self.callbacks = LoopCallbacks(callbacks, model)
        self.update = make_update_fn(model, target, optimizer, config)
        self.soft_update = make_soft_update_fn(model, target)
        self.actor = make_actor(model)
        self.rng = np.random.default_rng(seed_streams(run.seed)[0])
        self.best_weights: list[np.ndarray] | None = None
        self.elapsed_before = 0.0  # wall seconds of the runs this one resumes
        self.notes: list[str] = []  # said once the progress display is up

    @classmethod
    def from_recipe(
        cls, train: TrainConfig, env: EnvConfig, replay: ReplayConfig | None = None, seed: int = 0,
        ckpt_dir: Path | None = None, tb_dir: Path | None = None, label: str = "train",
        quiet: bool = False, initial_model: tf_keras.Model | None = None, initial_replay: ReplayBuffer | None = None,
        frozen_target: list[np.ndarray] | None = None, device: str = "auto", target_template: tf_keras.Model | None = None,
        callbacks: Sequence[tf_keras.callbacks.Callback] = (),
    ) -> DQNTrainer:
        """Build what the recipe's sections describe (threads, device, seeds, environment, replay,
        networks, optimizer), then the trainer. A fine-tune passes initial_model, initial_replay and
        the baseline's target (target_template with frozen_target weights), which is never updated."""
        configure_threads(train.intra_op_threads)
        device_kind = configure_device(device)
        cfg = train.model_copy(update={"jit_compile": use_xla(train.jit_compile, bool(train.conv))})
        if frozen_target is not None:  # a frozen target is one never due for an update
            cfg = cfg.model_copy(update={"target_update_interval": cfg.total_timesteps + 1})
        set_seed(seed)
        gym_env = make_env_from(env)
        info = env_info(gym_env, env.id)
        if initial_replay is None:
            initial_replay = build_replay(cfg, replay or ReplayConfig(), info, seed_streams(seed)[1])
        policy = mixed_precision_policy(cfg.mixed_precision, device_kind)
        model, target, optimizer = _networks(info, cfg, policy, initial_model, target_template, frozen_target)
        trainer = cls(model, target, optimizer, initial_replay, gym_env, cfg,
                      RunOptions(env, seed, ckpt_dir, tb_dir, label, quiet), callbacks)
        if cfg.mixed_precision and policy != "mixed_float16":
            trainer.notes.append("mixed_precision needs a GPU; training in float32 on the CPU")
        return trainer

    @property
    def dtype_policy(self) -> str:
        """The Keras dtype policy training ran under (mixed_float16 trains through a loss-scale optimizer)."""
        mixed = isinstance(self.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
        return "mixed_float16" if mixed else "float32"

    # -- the loop ------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run (or resume) training to config.total_timesteps and return the kept model."""
        cfg, state = self.config, self.state
        obs, resumed_from = self._begin()
        start_step, episode_return, episode_len = state.step, 0.0, 0
        try:
            while state.step < cfg.total_timesteps:
                # 1. Act: uniformly at random until learning_starts (as SB3), then epsilon-greedy.
                if state.step < cfg.learning_starts or self.rng.random() < linear_epsilon(state.step, cfg):
                    action = int(self.rng.integers(self.info.n_actions))
                else:
                    action = self.actor.act(obs)
                next_obs, reward, terminated, truncated, _ = self.env.step(action)
                self.replay.add(obs, action, reward, next_obs, terminated, truncated)
                obs = next_obs
                episode_return += float(reward)
                episode_len += 1
                state.step += 1
                # 2. Target updates are counted in env steps (as in SB3) and applied lazily.
                if state.step % cfg.target_update_interval == 0:
                    state.pending_target_updates += 1
                # 3. Train every train_freq steps once learning_starts have passed.
                if state.step % cfg.train_freq == 0 and state.step > cfg.learning_starts:
                    self._train_phase()
                if state.next_eval is not None and state.step >= state.next_eval:
                    self._periodic_eval()
                    state.next_eval += cfg.eval_interval
                    if cfg.stop_at_return is not None and self.recent_eval >= cfg.stop_at_return:
                        self.log.message(f"eval return {self.recent_eval:.1f} reached train.stop_at_return "
                                         f"{cfg.stop_at_return:g}: training stops at step {state.step}")
                        break
                # 4. Episode end: log and checkpoint (resume is exact at episode ends), then reset.
                if terminated or truncated:
                    self._end_episode(episode_return, episode_len)
                    episode_return, episode_len = 0.0, 0
                    obs, _ = self.env.reset()
            if state.next_eval is not None and (state.best_step is None or state.best_step < state.step):
                self._periodic_eval()  # the final weights are a candidate too
        except BaseException:
            self.log.close(state.step, failing=True)
            raise
        self.log.close(state.step)
        return self._finish(start_step, resumed_from)

    def _begin(self) -> tuple[np.ndarray, int | None]:
        """Resume from the latest checkpoint or seed the environment; show progress; start callbacks."""
        ckpt = latest_checkpoint(self.ckpt_dir) if self.ckpt_dir else None
        self._t0 = time.perf_counter()
        if ckpt is not None:
            _restore(self, ckpt)
            obs, _ = self.env.reset()
        else:
            obs = seed_env(self.env, self.run.seed)
        resumed_from = self.state.step if ckpt is not None else None
        self.log = RunLog(self.run, self.config.total_timesteps, self.state)
        if resumed_from is not None:
            self.log.message(f"resuming from checkpoint at step {resumed_from}")
        for note in self.notes:
            self.log.message(note)
        self.callbacks.on_train_begin()
        return obs, resumed_from

    def _train_phase(self) -> None:
        """K gradient steps on K sampled batches, in one call; then refresh the actor and log."""
        cfg, state = self.config, self.state
        self._flush_target()
        if cfg.learning_rate_schedule == "linear":  # SB3: set from the progress left before each phase
            self.optimizer.learning_rate.assign(cfg.learning_rate * (1.0 - state.step / cfg.total_timesteps))
        k_steps, batch = cfg.gradient_steps, cfg.batch_size
        b = self.replay.gather_n_step(self.replay.sample_indices(k_steps * batch), cfg.n_steps, cfg.gamma)

        def stack(x: np.ndarray) -> np.ndarray:
            return x.reshape((k_steps, batch) + x.shape[1:])

        arrays = (stack(b.observations), stack(b.actions.astype(np.int32)), stack(b.rewards),
                  stack(b.next_observations), stack(b.discounts))
        loss, q_mean = run_updates(self, self.update, arrays)
        self.actor.refresh()
        self.callbacks.on_phase_end({"step": state.step, "gradient_step": state.gradient_step,
                                     "loss": loss, "q_mean": q_mean})
        self.log.phase(state.step, loss, q_mean, linear_epsilon(state.step, cfg))

    def _flush_target(self) -> None:
        """Apply pending target updates in closed form: n Polyak steps of tau = one of 1-(1-tau)^n."""
        pending = self.state.pending_target_updates
        if pending:
            tau = 1.0 - (1.0 - self.config.tau) ** pending
            if tau >= 1.0:
                self.target.set_weights(self.model.get_weights())
            else:
                self.soft_update(tf.constant(tau, tf.float32))
            self.state.pending_target_updates = 0

    def _end_episode(self, episode_return: float, episode_len: int) -> None:
        state = self.state
        state.episodes += 1
        state.episode_returns.append(episode_return)
        self.log.episode(state.step, episode_return, episode_len)
        if self.ckpt_dir is not None and state.step >= state.next_checkpoint:
            while state.next_checkpoint <= state.step:
                state.next_checkpoint += self.config.checkpoint_interval
            self.save_checkpoint()

    def _finish(self, start_step: int, resumed_from: int | None) -> TrainResult:
        """Apply what is pending, end callbacks, and keep the best weights if evaluations chose some."""
        state = self.state
        self._flush_target()
        self.callbacks.on_train_end({"step": state.step, "gradient_step": state.gradient_step})
        run_seconds = time.perf_counter() - self._t0
        if self.best_weights is not None:
            self.model.set_weights(self.best_weights)
        self.env.close()
        return TrainResult(
            model=fold_dueling(self.model), replay=self.replay, info=self.info,
            env_steps=state.step, gradient_steps=state.gradient_step, episodes=state.episodes,
            wall_seconds=self.elapsed_before + run_seconds,
            env_steps_per_second=(state.step - start_step) / run_seconds if run_seconds > 0 else 0.0,
            resumed_from=resumed_from, selected_step=state.best_step, selected_return=state.best_return,
            episode_returns=list(state.episode_returns),
        )

    def _periodic_eval(self) -> None:
        state, seed = self.state, self.config.eval_seed
        returns = run_episodes(self.actor.act, self.run.env_config, range(seed, seed + self.config.eval_episodes))
        mean = float(np.mean(returns))
        self.recent_eval = mean
        self.log.scalar("eval/mean_return", mean, state.step)
        if state.best_return is None or mean >= state.best_return:
            state.best_return, state.best_step = mean, state.step
            self.best_weights = self.model.get_weights()
        self.log.message(f"step {state.step}: eval return {mean:.1f} (best {state.best_return:.1f} at {state.best_step})")

    def save_checkpoint(self) -> Path:
        """Save everything an exact resume needs, as checkpoint `step-<env step>`."""
        assert self.ckpt_dir is not None
        return write_checkpoint_dir(self.ckpt_dir, f"step-{self.state.step:09d}", partial(_write_checkpoint, self))


def _networks(
    info: EnvInfo, cfg: TrainConfig, policy: str, model: tf_keras.Model | None, target_template: tf_keras.Model | None,
    frozen_target: list[np.ndarray] | None,
) -> tuple[tf_keras.Model, tf_keras.Model, tf_keras.optimizers.Optimizer]:
    """The online network (built from cfg unless given), a target of the same architecture holding the
    online (or frozen_target) weights, and a built Adam; networks under the dtype policy."""
    previous_policy = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        if model is None:
            model = network_for(info, cfg, dueling=cfg.dueling)
        if target_template is not None:  # a fine-tune of a network not built from cfg
            target = tf_keras.models.clone_model(target_template)
        else:
            target = network_for(info, cfg, name="target", dueling=cfg.dueling)
    finally:
        tf_keras.mixed_precision.set_global_policy(previous_policy)
    target.set_weights(frozen_target if frozen_target is not None else model.get_weights())
    optimizer = tf_keras.optimizers.Adam(cfg.learning_rate)
    if policy == "mixed_float16":
        optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    return model, target, optimizer


class RunLog:
    """A run's progress line and TensorBoard scalars, with the recent episode returns they show."""

    phase_log_interval = 1000
    """Env steps between TensorBoard points of the phases' mean loss and Q-value. One eager scalar per
    phase costs about as much as a small phase's gradient step (docs/lunarlander-training.md); SB3
    also logs means over an interval."""

    def __init__(self, run: RunOptions, total_steps: int, state: TrainState) -> None:
        self.label = run.label
        self.progress = Progress(run.label, total_steps, state.step, run.quiet)
        self.tb_dir, self.writer = run.tb_dir, None
        if run.tb_dir:
            with self._refused():
                self.writer = tf.summary.create_file_writer(str(run.tb_dir))
        self.recent_returns: deque[float] = deque(state.episode_returns[-20:], maxlen=20)
        self._phase_sums, self._phases, self._epsilon = [0.0, 0.0], 0, 0.0
        self._next_point = state.step + self.phase_log_interval

    def _refused(self) -> contextlib.AbstractContextManager[None]:
        """A full or read-only disk as one line: the events file flushes as its queue fills, and
        TensorFlow reports the OS's refusal as a tf.errors.OpError, not an OSError."""
        return refused_writes(self.tb_dir, also=(tf.errors.OpError,))

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.writer is not None:
            with self._refused(), self.writer.as_default():
                tf.summary.scalar(name, value, step=step)

    def message(self, text: str) -> None:
        self.progress.message(f"[{self.label}] {text}")

    def episode(self, step: int, episode_return: float, length: int) -> None:
        self.recent_returns.append(episode_return)
        self.scalar("train/episode_return", episode_return, step)
        self.scalar("train/episode_length", length, step)

    def phase(self, step: int, loss: float, q_mean: float, epsilon: float) -> None:
        """Adds a phase to the means that the next TensorBoard point shows."""
        self._phase_sums[0] += loss
        self._phase_sums[1] += q_mean
        self._phases += 1
        self._epsilon = epsilon
        if step >= self._next_point:
            self._write_phase_means(step)
        self.progress.update(step, self.recent_return())

    def _write_phase_means(self, step: int) -> None:
        if self._phases:
            self.scalar("train/loss", self._phase_sums[0] / self._phases, step)
            self.scalar("train/q_mean", self._phase_sums[1] / self._phases, step)
            self.scalar("train/epsilon", self._epsilon, step)
        self._phase_sums, self._phases = [0.0, 0.0], 0
        self._next_point = step + self.phase_log_interval

    def recent_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def close(self, step: int, failing: bool = False) -> None:
        """failing: the loop is ending on an error, the one to report even if the same full disk
        refuses the last TensorBoard points too."""
        try:
            self._write_phase_means(step)
            if self.writer is not None:
                with self._refused():
                    self.writer.flush()
        except WriteRefused:
            if not failing:
                raise
        finally:
            self.progress.update(step, self.recent_return())
            self.progress.close()


# -- checkpoints: the trainer's files in one directory (see train_state.write_checkpoint_dir) ---


def _write_checkpoint(trainer: DQNTrainer, path: Path) -> None:
    """Weights, optimizer slots, replay and best weights as npz; counters and RNG states as JSON."""
    save_arrays(path / "model.npz", trainer.model.get_weights())
    save_arrays(path / "target.npz", trainer.target.get_weights())
    save_arrays(path / "optimizer.npz", [v.numpy() for v in trainer.optimizer.variables()])
    save_arrays(path / "replay.npz", trainer.replay.state_dict())
    if trainer.best_weights is not None:
        save_arrays(path / "best.npz", trainer.best_weights)
    extra = {"elapsed": trainer.elapsed_before + (time.perf_counter() - trainer._t0),
             "rng": json.dumps(trainer.rng.bit_generator.state), "env_rng": rng_state(trainer.env)}
    write_text_atomic(path / "state.json", json.dumps({**trainer.state.state_dict(), **extra}))


def _restore(trainer: DQNTrainer, path: Path) -> None:
    """Load what _write_checkpoint wrote (also checkpoints written before TrainState: same keys)."""
    saved = json.loads((path / "state.json").read_text())
    trainer.model.set_weights(load_arrays(path / "model.npz"))
    trainer.target.set_weights(load_arrays(path / "target.npz"))
    for var, value in zip(trainer.optimizer.variables(), load_arrays(path / "optimizer.npz")):
        var.assign(value)
    trainer.replay.load_state_dict(load_dict(path / "replay.npz"))
    if (path / "best.npz").exists():
        trainer.best_weights = load_arrays(path / "best.npz")
    trainer.state.load_state_dict(saved)
    trainer.elapsed_before = saved["elapsed"]
    bit_generator = np.random.PCG64()
    bit_generator.state = json.loads(saved["rng"])
    trainer.rng = np.random.Generator(bit_generator)
    set_rng_state(trainer.env, saved["env_rng"])
    trainer.actor.refresh()
