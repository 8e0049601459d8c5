import numpy as np

from compress_dqn.networks import NumpyActor, build_q_network, q_from_outputs, split_value_advantage


def test_split_head_is_exact_and_acts_on_the_advantage():
    model = build_q_network((4,), 3, [16, 16])
    obs = np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32)
    split = split_value_advantage(model)
    advantage, value = (x.numpy() for x in split(obs))
    np.testing.assert_allclose(q_from_outputs((advantage, value)), model(obs).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantage.mean(axis=1), 0.0, atol=1e-5)
    assert (advantage.argmax(1) == model(obs).numpy().argmax(1)).all()
    assert [layer.name for layer in split.layers[-2:]] == ["advantage", "value"]


def test_numpy_actor_matches_keras():
    model = build_q_network((2, 3), 4, [8], activation="tanh")
    obs = np.random.default_rng(1).normal(size=(50, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(NumpyActor(model).q_values(obs), model(obs).numpy(), rtol=1e-5, atol=1e-5)


def test_numpy_actor_act_matches_batch_argmax():
    model = build_q_network((4,), 3, [32, 32])
    actor = NumpyActor(model)
    obs = np.random.default_rng(2).normal(size=(300, 4)).astype(np.float32)
    assert [actor.act(o) for o in obs] == model(obs).numpy().argmax(1).tolist()
