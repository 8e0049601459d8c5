"""The DQN loop: schedules, the fused update, and exact resume."""

import numpy as np
import pytest

from compress_dqn._tf import tf_keras
from compress_dqn.rl.callbacks import Interrupt, PhaseCallback
from compress_dqn.recipe.schema import load_recipe
from compress_dqn.rl.trainer import DQNTrainer, latest_checkpoint, linear_epsilon

from conftest import TINY


def tiny(**overrides):
    return load_recipe(TINY, [f"{k}={v}" for k, v in overrides.items()])


def test_linear_epsilon_matches_sb3():
    cfg = tiny(**{"train.total_timesteps": 1000, "train.exploration_fraction": 0.1,
                  "train.exploration_final_eps": 0.05}).train
    assert linear_epsilon(0, cfg) == 1.0
    assert np.isclose(linear_epsilon(50, cfg), 0.525)
    assert linear_epsilon(100, cfg) == pytest.approx(0.05)
    assert linear_epsilon(900, cfg) == pytest.approx(0.05)


class StepCounter(tf_keras.callbacks.Callback):
    """Counts gradient steps one by one (batch hooks force the unfused path)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.calls += 1


class CrashAt(PhaseCallback):
    """Simulates a crash (kill) once training passes a step."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_phase_end(self, logs=None):
        if logs["step"] >= self.step:
            raise Interrupt(f"crash at {logs['step']}")


def train(recipe, **kwargs):
    return DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=recipe.seed, quiet=True, **kwargs).train()


def test_counts_match_sb3_semantics():
    recipe = tiny()
    result = train(recipe)
    cfg = recipe.train
    phases = sum(1 for s in range(1, cfg.total_timesteps + 1) if s % cfg.train_freq == 0 and s > cfg.learning_starts)
    assert result.env_steps == cfg.total_timesteps
    assert result.gradient_steps == phases * cfg.gradient_steps
    assert result.replay.num_transitions > 0


@pytest.mark.slow
def test_fused_phase_equals_one_call_per_gradient_step():
    recipe = tiny(**{"train.total_timesteps": 250})
    fused = train(recipe).model.get_weights()
    counter = StepCounter()
    stepped = train(recipe, callbacks=[counter]).model.get_weights()
    assert counter.calls == 2 * sum(1 for s in range(101, 251) if s % 4 == 0)
    for a, b in zip(fused, stepped):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_training_changes_weights_and_same_seed_same_result():
    recipe = tiny(**{"train.total_timesteps": 250})
    a = train(recipe)
    b = train(recipe)
    c = train(tiny(**{"train.total_timesteps": 250, "seed": 1}))
    for x, y in zip(a.model.get_weights(), b.model.get_weights()):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a.model.get_weights(), c.model.get_weights()))


@pytest.mark.slow
@pytest.mark.parametrize("variant", [{}, {"train.double_dqn": "true", "train.tau": 0.5}, {"train.dueling": "true"}])
def test_resume_after_crash_equals_uninterrupted_run(tmp_path, variant):
    recipe = tiny(**variant)
    reference = train(recipe)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Interrupt):
        train(recipe, ckpt_dir=ckpt, callbacks=[CrashAt(300)])
    saved = latest_checkpoint(ckpt)
    assert saved is not None
    resumed = train(recipe, ckpt_dir=ckpt)
    assert 0 < resumed.resumed_from < recipe.train.total_timesteps
    assert resumed.env_steps == reference.env_steps
    assert resumed.gradient_steps == reference.gradient_steps
    assert resumed.episode_returns == reference.episode_returns
    for x, y in zip(reference.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_best_weights_are_kept_when_periodic_eval_is_on():
    recipe = tiny(**{"train.eval_interval": 50, "train.eval_episodes": 3, "train.eval_seed": 1000,
                     "train.total_timesteps": 800, "train.learning_rate": 3e-3})
    trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, quiet=True)
    seen = []  # (mean return, step, weights) at every periodic evaluation
    evaluate = trainer._periodic_eval

    def spy():
        evaluate()
        seen.append((trainer.recent_eval, trainer.state.step, trainer.model.get_weights()))

    trainer._periodic_eval = spy
    result = trainer.train()
    assert len(seen) >= 4 and len({mean for mean, _, _ in seen}) > 1  # a real choice was made
    best = max(mean for mean, _, _ in seen)
    mean, step, weights = next(entry for entry in reversed(seen) if entry[0] == best)  # ties: the later one
    assert (result.selected_return, result.selected_step) == (mean, step)
    for kept, expected in zip(result.model.get_weights(), weights):
        np.testing.assert_array_equal(kept, expected)



@pytest.mark.slow
def test_training_stops_at_the_first_evaluation_that_reaches_stop_at_return():
    settings = {"train.eval_interval": 50, "train.eval_episodes": 3, "train.eval_seed": 1000,
                "train.total_timesteps": 800, "train.learning_rate": 3e-3}
    full = DQNTrainer.from_recipe(*_train_args(tiny(**settings)), seed=0, quiet=True)
    seen = []
    evaluate = full._periodic_eval

    def spy():
        evaluate()
        seen.append((full.state.step, full.recent_eval))

    full._periodic_eval = spy
    full.train()
    # A bar that some evaluation reaches, but not the first: the rule must pick that one.
    bar = max(mean for _, mean in seen)
    assert seen[0][1] < bar
    stop_step = next(step for step, mean in seen if mean >= bar)
    stopped = DQNTrainer.from_recipe(*_train_args(tiny(**settings, **{"train.stop_at_return": bar})),
                                     seed=0, quiet=True).train()
    assert stopped.env_steps == stop_step < 800
    assert (stopped.selected_step, stopped.selected_return) == (stop_step, bar)


def test_stop_at_return_needs_periodic_evaluations():
    from compress_dqn.errors import UserError

    with pytest.raises(UserError, match="stop_at_return 500.0 needs periodic evaluations"):
        tiny(**{"train.eval_interval": 0, "train.stop_at_return": 500})


def _train_args(recipe):
    return recipe.train, recipe.env, recipe.replay

def _update_pair(cfg):
    """Two identical model/target/optimizer sets: one for the fast path, one for the generic path."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.rl.networks import build_q_network

    sets = []
    for _ in range(2):
        model, target = build_q_network((4,), 2, [32, 32]), build_q_network((4,), 2, [32, 32])
        optimizer = tf_keras.optimizers.Adam(1e-2)
        optimizer.build(model.trainable_variables)
        sets.append((model, target, optimizer))
    weights = sets[0][0].get_weights()
    for model, target, _ in sets:
        model.set_weights(weights)
        target.set_weights([w * 0.9 for w in weights])
    return sets


@pytest.mark.parametrize("double_dqn", [False, True])
def test_fast_mlp_update_equals_generic_update(double_dqn):
    from compress_dqn.rl import fast_update
    from compress_dqn.rl.updates import make_generic_update_fn

    cfg = tiny(**{"train.max_grad_norm": 0.5, "train.double_dqn": str(double_dqn).lower()}).train  # clipping active
    (m1, t1, o1), (m2, t2, o2) = _update_pair(cfg)
    assert fast_update.make_update_fn(m1, t1, tf_keras.optimizers.SGD(1e-2), cfg) is None  # hand-derived for Adam only
    fast, generic = fast_update.make_update_fn(m1, t1, o1, cfg), make_generic_update_fn(m2, t2, o2, cfg)
    assert fast is not None
    initial = m1.get_weights()
    rng = np.random.default_rng(0)
    for k in (1, 10, 39):  # 50 gradient steps in calls of different sizes
        obs = rng.normal(size=(k, 16, 4)).astype(np.float32)
        data = (obs, rng.integers(0, 2, (k, 16)).astype(np.int32), rng.normal(size=(k, 16)).astype(np.float32),
                rng.normal(size=(k, 16, 4)).astype(np.float32), 0.99 * (rng.random((k, 16)) >= 0.1).astype(np.float32))
        loss_fast, _ = fast(*data)
        loss_generic, _ = generic(*data)
        np.testing.assert_allclose(float(loss_fast), float(loss_generic), rtol=1e-4)
    moved = max(np.abs(a - b).max() for a, b in zip(m1.get_weights(), initial))
    for a, b in zip(m1.get_weights(), m2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert int(o1.iterations.numpy()) == int(o2.iterations.numpy()) == 50
    assert moved > 1e-3  # the weights really changed


class PhaseLog(PhaseCallback):
    """Records the learning rate at each phase end."""

    def __init__(self):
        super().__init__()
        self.rates = []
        self.trainer = None

    def on_phase_end(self, logs=None):
        self.rates.append((logs["step"], float(self.trainer.optimizer.learning_rate.numpy())))


def test_zoo_linear_learning_rate_decays_to_zero_like_sb3():
    recipe = tiny(**{"train.learning_rate": "lin_1e-3", "train.total_timesteps": 400})
    assert recipe.train.learning_rate == 1e-3 and recipe.train.learning_rate_schedule == "linear"
    log = PhaseLog()
    log.trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, callbacks=[log], quiet=True)
    log.trainer.train()
    for step, rate in log.rates:
        # Set before the phase at `step` from the progress left: 1e-3 * (1 - step / 400).
        assert rate == pytest.approx(1e-3 * (1 - step / 400), rel=1e-5)
    assert log.rates[-1][1] < 1e-4 < log.rates[0][1]


def test_acts_uniformly_at_random_before_learning_starts(monkeypatch):
    """SB3 fills the buffer with random actions: a greedy actor must not be asked before learning_starts."""
    recipe = tiny(**{"train.learning_starts": 300, "train.total_timesteps": 320, "train.exploration_final_eps": 0.0,
                     "train.exploration_initial_eps": 0.0})
    trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, quiet=True)
    asked = []
    act = trainer.actor.act
    trainer.actor.act = lambda obs: asked.append(trainer.state.step) or act(obs)
    result = trainer.train()
    assert asked and min(asked) == 300  # epsilon 0: greedy from learning_starts on, never before
    actions = result.replay.gather(np.flatnonzero(result.replay._flags[:300] & 1)).actions
    assert 0.3 < actions.mean() < 0.7  # CartPole's two actions, drawn uniformly


@pytest.mark.slow
def test_n_step_training_runs_and_differs_from_one_step():
    one = train(tiny())
    three = train(tiny(**{"train.n_steps": 3}))
    assert one.gradient_steps == three.gradient_steps
    assert any(not np.array_equal(a, b) for a, b in zip(one.model.get_weights(), three.model.get_weights()))


def test_exploration_and_replay_sampling_draw_from_independent_streams():
    recipe = tiny()
    trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=5, quiet=True)
    acting = trainer.rng.integers(0, 2**31, size=16)
    sampling = trainer.replay._rng.integers(0, 2**31, size=16)
    assert not np.array_equal(acting, sampling)


def test_td_fine_tunes_do_not_reuse_another_training_seeds_episodes():
    from compress_dqn.compress.recovery import fine_tune_seed

    seeds = {fine_tune_seed(s, name) for s in range(4) for name in ("qat-int8", "prune-80")}
    assert len(seeds) == 8 and not seeds & set(range(5))
    assert fine_tune_seed(0, "qat-int8") == fine_tune_seed(0, "qat-int8")  # stable across processes


class Recorder(PhaseCallback):
    """Records the loop's events as a Keras callback hears them."""

    def __init__(self, per_step: bool):
        super().__init__()
        self.per_step, self.events = per_step, []

    def _implements_train_batch_hooks(self):
        return self.per_step

    def on_train_begin(self, logs=None): self.events.append(("begin",))
    def on_train_batch_begin(self, batch, logs=None): self.events.append(("step", batch))
    def on_phase_end(self, logs=None): self.events.append(("phase", logs["step"], logs["gradient_step"]))
    def on_epoch_end(self, epoch, logs=None): self.events.append(("epoch_end", epoch))
    def on_train_end(self, logs=None): self.events.append(("end", logs["step"], logs["gradient_step"]))


@pytest.mark.parametrize("per_step", [True, False])
def test_callbacks_hear_the_loop_as_under_fit(per_step):
    recipe = tiny(**{"train.total_timesteps": 120})
    recorder = Recorder(per_step)
    result = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, callbacks=(recorder,),
                                    quiet=True).train()
    kinds = [e[0] for e in recorder.events]
    assert kinds[0] == "begin" and kinds[-2:] == ["epoch_end", "end"] and recorder.events[-1] == ("end", 120, 10)
    # Batch hooks only for a callback that has them: otherwise each phase is one fused call.
    assert kinds.count("step") == (result.gradient_steps if per_step else 0) and result.gradient_steps == 10
    assert kinds.count("phase") == 5 and ("phase", 104, 2) in recorder.events


def test_train_state_round_trips_under_the_checkpoint_keys():
    from compress_dqn.rl.train_state import TrainState

    state = TrainState(step=7, gradient_step=3, episode_returns=[1.0, 2.0], next_eval=50)
    saved = state.state_dict()
    # The keys checkpoints have always used, so older checkpoints resume.
    assert set(saved) == {"step", "gradient_step", "episodes", "pending_target_updates", "next_checkpoint",
                          "next_eval", "best_return", "best_step", "episode_returns"}
    restored = TrainState()
    restored.load_state_dict({**saved, "elapsed": 1.5, "rng": "{}", "env_rng": "{}"})
    assert restored == state and restored.episode_returns is not state.episode_returns


def test_tfmot_pruning_callback_plugs_in_and_a_fine_tune_keeps_the_baseline_target():
    import tensorflow_model_optimization as tfmot

    from compress_dqn.compress import prune
    from compress_dqn.envs.environment import probe_env
    from compress_dqn.rl.networks import network_for
    from compress_dqn.recipe.schema import PruneConfig

    recipe = tiny(**{"train.total_timesteps": 200, "train.jit_compile": "false"})
    baseline = network_for(probe_env(recipe.env), recipe.train)
    wrapped = prune.prune_model(baseline, PruneConfig(sparsity=0.5, frequency=5), total_steps=50)
    trainer = DQNTrainer.from_recipe(
        recipe.train, recipe.env, recipe.replay, seed=0, quiet=True, callbacks=[tfmot.sparsity.keras.UpdatePruningStep()],
        initial_model=wrapped, frozen_target=baseline.get_weights(), target_template=baseline,
    )
    result = trainer.train()
    assert result.gradient_steps == 50
    assert all(s == pytest.approx(0.5, abs=0.02) for s in prune.kernel_sparsity(prune.strip(wrapped)).values())
    for kept, frozen in zip(trainer.target.get_weights(), baseline.get_weights()):
        np.testing.assert_array_equal(kept, frozen)


def test_tensorboard_gets_the_phases_mean_once_per_interval_and_the_rest_at_close(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from compress_dqn.rl.trainer import RunLog
    from compress_dqn.rl.train_state import TrainState

    points: list[tuple[str, float, int]] = []
    monkeypatch.setattr(RunLog, "scalar", lambda self, name, value, step: points.append((name, value, step)))
    monkeypatch.setattr(RunLog, "phase_log_interval", 10)
    log = RunLog(SimpleNamespace(label="t", quiet=True, tb_dir=tmp_path), 100, TrainState())
    for step, loss in zip(range(4, 29, 4), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]):  # steps 4, 8, ..., 28
        log.phase(step, loss, 10 * loss, epsilon=1.0 / step)
    log.close(28)
    losses = [(value, step) for name, value, step in points if name == "train/loss"]
    # Points at the first phase past each interval (12, then 12 + 10 = 22 -> 24), the rest at close.
    assert losses == [(2.0, 12), (5.0, 24), (7.0, 28)]  # means of (1, 2, 3), (4, 5, 6), (7)
    assert [(v, s) for n, v, s in points if n == "train/q_mean"] == [(20.0, 12), (50.0, 24), (70.0, 28)]
    assert [(v, s) for n, v, s in points if n == "train/epsilon"] == [(1 / 12, 12), (1 / 24, 24), (1 / 28, 28)]


@pytest.mark.slow
def test_dueling_training_learns_through_two_heads_and_returns_the_plain_network():
    """train.dueling trains V and A heads (other weights than the plain head), and the result is the
    plain Sequential the pipeline rebuilds from the recipe, computing the dueling network's Q-values."""
    from compress_dqn.rl.networks import dueling_heads, network_for

    recipe = tiny(**{"train.dueling": "true"})
    trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, quiet=True)
    assert dueling_heads(trainer.model) is not None and dueling_heads(trainer.target) is not None
    result = trainer.train()
    plain = network_for(result.info, recipe.train)
    plain.set_weights(result.model.get_weights())
    obs = np.random.default_rng(0).normal(size=(200,) + result.info.obs_shape).astype(np.float32)
    np.testing.assert_allclose(plain(obs).numpy(), trainer.model(obs).numpy(), rtol=1e-5, atol=1e-5)
    unlike = train(tiny())
    assert any(not np.array_equal(a, b) for a, b in zip(result.model.get_weights(), unlike.model.get_weights()))
