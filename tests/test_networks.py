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


class _Conv:
    def __init__(self, filters: int, kernel: int, stride: int) -> None:
        self.filters, self.kernel, self.stride = filters, kernel, stride


def test_numpy_actor_runs_cnns_like_keras():
    """MinAtar's network (uint8 0/1 input) and a strided Nature-style stack on pixels."""
    rng = np.random.default_rng(3)
    cases = [
        ((10, 10, 4), [_Conv(16, 3, 1)], [128], 1.0, rng.integers(0, 2, size=(20, 10, 10, 4))),
        ((36, 36, 4), [_Conv(8, 8, 4), _Conv(16, 4, 2), _Conv(16, 3, 1)], [32], 1 / 255, rng.integers(0, 256, size=(20, 36, 36, 4))),
    ]
    for shape, conv, dense, scale, obs in cases:
        model = build_q_network(shape, 6, dense, conv=conv, input_scale=scale)
        obs = obs.astype(np.uint8)
        actor = NumpyActor(model)
        keras_q = model(obs.astype(np.float32)).numpy()
        np.testing.assert_allclose(actor.q_values(obs), keras_q, rtol=1e-4, atol=1e-5)
        assert [actor.act(o) for o in obs] == keras_q.argmax(1).tolist()


def test_conv_layers_need_image_observations():
    import pytest

    with pytest.raises(ValueError, match=r"conv layers need \(height, width, channels\)"):
        build_q_network((8,), 2, [16], conv=[_Conv(4, 3, 1)])
