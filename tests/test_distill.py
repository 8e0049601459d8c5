import numpy as np
import pytest

from compress_dqn.compress.build import build_variant
from compress_dqn.rl.networks import count_params, q_from_outputs

from conftest import variant


def q_of(model, obs):
    return q_from_outputs(model(obs)).numpy()


def test_student_is_smaller_and_learns_the_teacher(trained_tiny):
    recipe, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(1000)).observations
    teacher_q = result.model(obs).numpy()
    short = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 5}),
                          result.model, result.replay, recipe, result.info, quiet=True)
    long = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 600, "learning_rate": 3e-3}),
                         result.model, result.replay, recipe, result.info, quiet=True)
    assert long.params < count_params(result.model)[0] / 10
    error_short = np.mean((q_of(short.export_model, obs) - teacher_q) ** 2)
    error_long = np.mean((q_of(long.export_model, obs) - teacher_q) ** 2)
    assert error_long < 0.2 * error_short
    agreement = np.mean(q_of(long.export_model, obs).argmax(1) == teacher_q.argmax(1))
    assert agreement > 0.9
    assert long.details.fine_tune.method == "distill"
    assert long.details.fine_tune.gradient_steps == 600


def test_mse_loss_is_available(trained_tiny):
    recipe, result = trained_tiny
    built = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 50, "loss": "mse"}),
                          result.model, result.replay, recipe, result.info, quiet=True)
    assert np.isfinite(built.details.fine_tune.final_loss)


def test_keep_best_policy_restores_the_best_evaluated_weights(monkeypatch):
    """Selection episodes score each snapshot; the weights that end up in the model are the best
    one's (the latest among ties), whatever came after."""
    import compress_dqn.rl.callbacks as callbacks_module
    from compress_dqn.rl.callbacks import KeepBestPolicy
    from compress_dqn.rl.networks import build_q_network

    model = build_q_network((4,), 2, [8])
    scores = {1.0: 50.0, 2.0: 200.0, 3.0: 200.0, 4.0: 20.0, 5.0: 90.0}  # by the value every bias holds
    monkeypatch.setattr(callbacks_module, "run_episodes",
                        lambda act, env, seeds: [scores[float(model.layers[-1].bias.numpy()[0])]] * len(list(seeds)))
    keep = KeepBestPolicy(env=None, seeds=range(3), every=100)
    keep.set_model(model)
    for step, value in zip((100, 200, 300, 400), (1.0, 2.0, 3.0, 4.0)):
        for w in model.weights:
            w.assign(np.full(w.shape, value, dtype=np.float32))
        keep.on_phase_end({"gradient_step": step})
    for w in model.weights:
        w.assign(np.full(w.shape, 5.0, dtype=np.float32))
    keep.on_train_end({"gradient_step": 450})
    assert all(np.all(w.numpy() == 3.0) for w in model.weights)  # 200 at steps 200 and 300: the latest
    assert keep.summary().selected_step == 300
    assert [s for s, _ in keep.summary().evaluations] == [100, 200, 300, 400, 450]  # (no train_begin here)


def test_selection_episodes_may_not_overlap_any_look_of_the_evaluation():
    from compress_dqn.errors import UserError
    from compress_dqn.recipe.schema import load_recipe

    from conftest import TINY

    student = "variants=[{name: s, student: {net_arch: [4]}, fine_tune: {select_interval: 100}}]"
    with pytest.raises(UserError, match=r"train.eval_seed range \[300, 310\) overlaps eval.seed range \[0, 400\)"):
        load_recipe(TINY, [student, "train.eval_seed=300", "eval.max_episodes=400"])
    load_recipe(TINY, [student, "train.eval_seed=400", "eval.max_episodes=400"])


def test_teacher_table_holds_the_teachers_q_values_of_every_row(trained_tiny):
    """A long distillation looks the teacher's Q-values up instead of recomputing them per sample:
    the table must give what the teacher computes on the sampled rows' observations."""
    from compress_dqn.compress.distill import teacher_table
    from compress_dqn.rl.networks import make_actor

    recipe, result = trained_tiny
    teacher, replay = make_actor(result.model), result.replay
    assert teacher_table(teacher, replay, lookups=replay.size) is None  # no saving: computed per sample
    table = teacher_table(teacher, replay, lookups=10 * replay.size, chunk=97)  # chunks that do not divide it
    assert table.shape == (replay.size, result.info.n_actions)
    rows = replay.sample_indices(500)
    np.testing.assert_allclose(table[rows], teacher.q_values(replay.observations_at(rows)), rtol=1e-5, atol=1e-5)


def test_the_student_plays_and_the_teacher_labels_what_it_visits(trained_tiny):
    """DAgger: after each interval the student plays; half of each later batch is its states, with
    the teacher's Q-values for them."""
    from compress_dqn.compress.distill import Distiller, build_student
    from compress_dqn.rl.networks import make_actor
    from compress_dqn.recipe.schema import FineTuneConfig, StudentConfig

    recipe, result = trained_tiny
    student = build_student(result.info, StudentConfig(net_arch=[8]))
    ft = FineTuneConfig(steps=300, learning_rate=1e-3, batch_size=32, student_states=50, student_states_interval=100)
    distiller = Distiller(student, result.model, result.replay, ft, quiet=True, phase_steps=64, env=recipe.env, seed=3)
    assert distiller.rounds == [100, 200]
    distiller.run()
    played = distiller.played
    assert played.size == 100  # two plays of 50 steps
    np.testing.assert_allclose(played.teacher_q[:100], make_actor(result.model).q_values(played.states[:100]),
                               rtol=1e-5, atol=1e-5)
    assert len(np.unique(played.states[:100], axis=0)) > 90  # states of real episodes, not one repeated
    obs, teacher_q = distiller._batches(2)
    assert obs.shape == (2, 32, 4) and teacher_q.shape == (2, 32, 2)
    played_rows = {row.tobytes() for row in played.states[:100]}
    assert all(row.tobytes() in played_rows for row in obs[:, 16:].reshape(-1, 4))  # the second half: played states


def test_a_costly_per_call_student_plays_its_states_side_by_side(trained_tiny):
    """A Keras student (a QAT one in a build) plays SIDE_BY_SIDE episodes at once, one call a step
    for all of them; its states are labelled with the teacher's Q-values and its episodes go on at
    the next play."""
    from compress_dqn.compress.distill import SIDE_BY_SIDE, StudentStates
    from compress_dqn.envs.environment import make_env_from, seed_env
    from compress_dqn.rl.networks import KerasActor, make_actor

    recipe, result = trained_tiny
    student, teacher = KerasActor(result.model), make_actor(result.model)
    calls = []
    counted = student.q_values
    student.q_values = lambda obs: calls.append(len(obs)) or counted(obs)
    played = StudentStates(recipe.env, 3, steps=100, plays=2, obs_shape=result.info.obs_shape,
                           n_actions=result.info.n_actions)
    played.collect(student, teacher)
    assert calls == [SIDE_BY_SIDE] * (100 // SIDE_BY_SIDE) + [100 % SIDE_BY_SIDE]
    lanes = [obs.copy() for _, obs in played.lanes]
    played.collect(student, teacher)
    played.close()
    assert played.size == 200 and len(played.lanes) == SIDE_BY_SIDE
    np.testing.assert_allclose(played.teacher_q[:200], teacher.q_values(played.states[:200]), rtol=1e-5, atol=1e-5)
    assert len(np.unique(played.states[:SIDE_BY_SIDE], axis=0)) == SIDE_BY_SIDE  # episodes of their own seeds
    # The second play starts where each lane's episode stood at the end of the first.
    np.testing.assert_array_equal(played.states[100:100 + SIDE_BY_SIDE], np.stack(lanes))
    # The first lane is the environment a cheap student plays alone, seeded as it is: every
    # SIDE_BY_SIDE-th row is its greedy episode.
    env = make_env_from(recipe.env)
    obs, rows = seed_env(env, 3), []
    for _ in range(100 // SIDE_BY_SIDE + 1):
        rows.append(obs)
        obs, _, terminated, truncated, _ = env.step(teacher.act(obs))
        obs = env.reset()[0] if terminated or truncated else obs
    np.testing.assert_allclose(played.states[:100:SIDE_BY_SIDE], np.stack(rows), rtol=1e-6)


def test_a_linear_schedule_ends_the_fine_tune_at_rest(trained_tiny):
    from compress_dqn.compress.distill import Distiller, build_student
    from compress_dqn.recipe.schema import FineTuneConfig, StudentConfig

    recipe, result = trained_tiny
    student = build_student(result.info, StudentConfig(net_arch=[8]))
    ft = FineTuneConfig(steps=200, learning_rate=1e-3, batch_size=32, learning_rate_schedule="linear")
    distiller = Distiller(student, result.model, result.replay, ft, quiet=True)
    distiller.run()
    assert int(distiller.optimizer.iterations) == 200
    assert float(distiller.optimizer.learning_rate) == pytest.approx(1e-3 / 200, rel=1e-4)  # the last step's


def test_a_conv_student_plays_image_states_and_the_teacher_labels_them():
    """DAgger on MinAtar: the student plays the image task as training built it; its states are
    kept as uint8 frames (not floats) and labelled with the teacher's Q-values."""
    from compress_dqn.compress.distill import Distiller, build_student
    from compress_dqn.recipe.schema import FineTuneConfig, StudentConfig, load_recipe
    from compress_dqn.replay.buffer import ReplayBuffer
    from compress_dqn.envs.environment import env_info, make_env_from, seed_env
    from compress_dqn.rl.networks import make_actor, network_for

    from conftest import MINATAR

    recipe = load_recipe(MINATAR)
    env = make_env_from(recipe.env)
    info = env_info(env, recipe.env.id)
    teacher = network_for(info, recipe.train)
    replay = ReplayBuffer(1000, info.obs_shape, info.obs_dtype, info.n_actions, seed=0)
    obs, rng = seed_env(env, 0), np.random.default_rng(0)
    for _ in range(400):
        action = int(rng.integers(info.n_actions))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, action, reward, next_obs, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else next_obs
    student = build_student(info, StudentConfig(conv=[{"filters": 4, "kernel": 3}], net_arch=[8]))
    ft = FineTuneConfig(steps=200, learning_rate=1e-3, batch_size=16, student_states=60, student_states_interval=100)
    distiller = Distiller(student, teacher, replay, ft, quiet=True, phase_steps=50, env=recipe.env, seed=5)
    distiller.run()
    played = distiller.played
    assert played.size == 60 and played.states.dtype == np.uint8 and played.states.shape[1:] == (10, 10, 4)
    np.testing.assert_allclose(played.teacher_q[:60], make_actor(teacher).q_values(played.states[:60]), rtol=1e-5, atol=1e-5)
    obs, teacher_q = distiller._batches(2)
    assert obs.shape == (2, 16, 10, 10, 4) and obs.dtype == np.uint8 and teacher_q.shape == (2, 16, 3)
    played_rows = {row.tobytes() for row in played.states[:60]}
    assert all(row.tobytes() in played_rows for row in obs[:, 8:].reshape(-1, 10, 10, 4))


def test_the_advantage_term_adds_the_advantages_squared_error_over_their_variance():
    """advantage_weight w adds w / advantage_scale x mean((A_student - A_teacher)^2), A = Q - mean_a Q:
    a student whose Q-values are right on average but whose action gaps are squeezed pays for it."""
    import tensorflow as tf

    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.distill import make_distill_update_fn

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(1, 64, 5)).astype(np.float32)
    teacher = rng.normal(size=(1, 64, 3)).astype(np.float32) * 3

    def loss_with(weight):
        student = tf_keras.Sequential([tf_keras.Input((5,)), tf_keras.layers.Dense(3, kernel_initializer="ones")])
        update = make_distill_update_fn(student, tf_keras.optimizers.SGD(0.0), None, False,
                                        value_scale=2.0, advantage_weight=weight, advantage_scale=0.5)
        q = student(obs[0]).numpy()
        return float(update(tf.constant(obs), tf.constant(teacher))[0]), q

    plain, q = loss_with(0.0)
    weighted, _ = loss_with(3.0)
    centred = lambda x: x - x.mean(axis=-1, keepdims=True)  # noqa: E731
    expected = 3.0 / 0.5 * np.mean((centred(q) - centred(teacher[0])) ** 2)
    assert expected > 0.1
    assert weighted - plain == pytest.approx(expected, rel=1e-4)


def test_the_margin_term_adds_the_shortfall_of_the_students_lead_over_the_teachers_gap():
    """margin_weight w adds w / sqrt(advantage_scale) x mean(max(0, teacher gap - student's lead of the
    teacher's best action)): zero where the student leads by as much, the shortfall where it ranks it lower."""
    import tensorflow as tf

    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.distill import make_distill_update_fn

    teacher = np.array([[[3.0, 1.0, 0.0], [0.0, 2.0, 1.5], [1.0, 1.0, 5.0]]], np.float32)  # gaps 2, 0.5, 4
    bias = np.array([0.0, 1.0, 0.5], np.float32)  # the student's Q: the same on every state

    def loss_with(weight):
        student = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(3, kernel_initializer="zeros")])
        student.layers[-1].set_weights([np.zeros((2, 3), np.float32), bias])
        update = make_distill_update_fn(student, tf_keras.optimizers.SGD(0.0), None, False,
                                        value_scale=2.0, advantage_scale=4.0, margin_weight=weight)
        return float(update(tf.constant(np.zeros((1, 3, 2), np.float32)), tf.constant(teacher))[0])

    # state 0: best 0, student lead 0 - 1 = -1, shortfall 2 + 1 = 3; state 1: best 1, lead 1 - 0.5 = 0.5,
    # shortfall 0; state 2: best 2, lead 0.5 - 1 = -0.5, shortfall 4.5
    expected = 2.0 / 4.0 ** 0.5 * np.mean([3.0, 0.0, 4.5])
    assert loss_with(2.0) - loss_with(0.0) == pytest.approx(expected, rel=1e-5)
