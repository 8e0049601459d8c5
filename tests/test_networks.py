import numpy as np
import pytest

from compress_dqn.compress.rewrites import split_value_advantage
from compress_dqn.rl.networks import NumpyActor, build_q_network, q_from_outputs


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


def test_numpy_actor_sees_new_weights_only_when_refreshed():
    """refresh() copies: an optimizer step (in place) or set_weights changes the actor only at the
    next refresh, which then matches Keras."""
    from compress_dqn._tf import tf, tf_keras

    model = build_q_network((4,), 3, [16, 16])
    actor = NumpyActor(model)
    obs = np.random.default_rng(4).normal(size=(64, 4)).astype(np.float32)
    before = actor.q_values(obs)
    optimizer = tf_keras.optimizers.Adam(0.1)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(obs)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    np.testing.assert_array_equal(actor.q_values(obs), before)
    actor.refresh()
    np.testing.assert_allclose(actor.q_values(obs), model(obs).numpy(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(actor.q_values(obs), before)
    model.set_weights([w * 0.5 for w in model.get_weights()])
    actor.refresh()
    np.testing.assert_allclose(actor.q_values(obs), model(obs).numpy(), rtol=1e-5, atol=1e-5)


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


def test_fan_in_uniform_init_draws_kernels_and_biases_like_torch():
    """U(+-1/sqrt(fan_in)) for kernels and biases (nn.Linear's and nn.Conv2d's default)."""
    from compress_dqn._tf import set_seed

    set_seed(0)  # the head's 3 biases all fall under half the bound for 1 draw in 8: not this one
    model = build_q_network((10, 10, 4), 3, [64], conv=[_Conv(16, 3, 1)])
    conv, hidden, head = [layer.get_weights() for layer in model.layers if layer.weights]
    for (kernel, bias), fan_in in ((conv, 3 * 3 * 4), (hidden, 8 * 8 * 16), (head, 64)):
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(kernel).max() <= bound and np.abs(bias).max() <= bound
        assert np.abs(kernel).max() > 0.9 * bound  # fills the range
        assert np.abs(bias).max() > 0.5 * bound  # biases are not zero
    glorot = build_q_network((4,), 2, [64], init="glorot_uniform")
    assert all(not layer.get_weights()[1].any() for layer in glorot.layers if layer.weights)  # zero biases
    with pytest.raises(ValueError, match="unknown init"):
        build_q_network((4,), 2, [8], init="zeros")


def test_a_model_made_to_take_normalized_input_computes_the_same_q_values():
    from compress_dqn.compress.rewrites import input_statistics, normalize_model_input, split_value_advantage

    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(200, 4)) * [2.0, 0.01, 5.0, 0.0] + [1.0, 0.0, -3.0, 7.0]).astype(np.float32)
    norm = input_statistics(obs)
    assert norm.std[3] == 1.0  # a constant feature passes through unscaled
    model = split_value_advantage(build_q_network((4,), 3, [16, 16]))
    before = model.get_weights()[0].copy()
    folded = normalize_model_input(model, norm)
    a, v = model(obs)
    fa, fv = folded(norm.apply(obs))
    np.testing.assert_allclose(fa + fv, a + v, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(model.get_weights()[0], before)  # the original is untouched
    with pytest.raises(TypeError, match="flat observations"):
        normalize_model_input(build_q_network((6, 6, 1), 2, [8], conv=[_Conv(2, 3, 1)]), norm)


def test_input_range_puts_every_feature_in_minus_one_to_one():
    from compress_dqn.compress.rewrites import input_range

    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(300, 4)) * [2.0, 0.01, 5.0, 0.0] + [1.0, 0.0, -3.0, 7.0]).astype(np.float32)
    obs[:3, 0] = 40.0  # a heavy tail: (obs - mean) / std would stretch this feature's range to ~20 std
    norm = input_range(obs)
    scaled = norm.apply(obs)
    assert norm.std[3] == 1.0  # a constant feature passes through unscaled
    np.testing.assert_allclose(scaled[:, :3].min(0), -1.0, atol=1e-5)
    np.testing.assert_allclose(scaled[:, :3].max(0), 1.0, atol=1e-5)


def test_action_head_chooses_the_advantages_argmax_within_its_range():
    from compress_dqn.compress.rewrites import with_action_head

    rng = np.random.default_rng(1)
    obs = rng.normal(size=(400, 4)).astype(np.float32)
    model = split_value_advantage(build_q_network((4,), 3, [16, 16]))
    extended = with_action_head(model, obs[:200])
    advantage, value, head = (t.numpy() for t in extended(obs))
    a, v = model(obs)
    np.testing.assert_allclose(advantage, a.numpy(), rtol=1e-6)  # the split heads are untouched
    np.testing.assert_allclose(value, v.numpy(), rtol=1e-6)
    assert head.min() >= 0.0 and head.max() <= 6.0  # ReLU6: the range an int8 output gets
    calibrated = advantage[:200].max(1).max()
    inside = advantage.max(1) < calibrated  # the head saturates above the calibrated best advantage
    assert inside[:200].sum() == 199 and inside.sum() > 300
    np.testing.assert_array_equal(head[inside].argmax(1), advantage[inside].argmax(1))
    # Linear in the advantage where it is not clipped: the floor sits at -1/8 of the top.
    top = head.max(1) > 0
    np.testing.assert_allclose(head.max(1)[inside & top] * (calibrated * 1.125) / 6 - calibrated / 8,
                               advantage.max(1)[inside & top], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cnn", [False, True])
def test_a_dueling_network_folds_into_the_plain_network_with_the_same_q_values(cnn):
    """Q = V + A - mean A is linear in the heads, so one Dense head computes it exactly: the
    folded network has the plain network's layers and shapes, and NumpyActor runs the dueling one."""
    from compress_dqn.rl.networks import dueling_heads, fold_dueling, make_actor

    rng = np.random.default_rng(7)
    if cnn:
        shape, kwargs = (10, 10, 2), {"conv": [_Conv(4, 3, 2)], "input_scale": 1 / 255}
        obs = rng.integers(0, 256, size=(64,) + shape).astype(np.uint8)
    else:
        shape, kwargs = (6,), {}
        obs = rng.normal(size=(64, 6)).astype(np.float32)
    dueling = build_q_network(shape, 3, [16, 16], dueling=True, **kwargs)
    value, advantage = dueling_heads(dueling)
    # Give the heads weights whose advantages are far from mean-zero, so the combination matters.
    advantage.set_weights([w + rng.normal(size=w.shape).astype(np.float32) for w in advantage.get_weights()])
    value_out = _head_output(dueling, "value", obs)
    advantage_out = _head_output(dueling, "advantage", obs)
    q = dueling(obs).numpy()
    np.testing.assert_allclose(q, value_out + advantage_out - advantage_out.mean(1, keepdims=True), rtol=1e-5, atol=1e-5)
    folded = fold_dueling(dueling)
    plain = build_q_network(shape, 3, [16, 16], **kwargs)
    assert [layer.name for layer in folded.layers] == [layer.name for layer in plain.layers]
    assert [w.shape for w in folded.get_weights()] == [w.shape for w in plain.get_weights()]
    np.testing.assert_allclose(folded(obs).numpy(), q, rtol=1e-5, atol=1e-5)
    actor = make_actor(dueling)
    assert isinstance(actor, NumpyActor)
    np.testing.assert_allclose(actor.q_values(obs), q, rtol=1e-5, atol=1e-5)
    assert dueling_heads(folded) is None and fold_dueling(plain) is plain


def _head_output(model, layer_name, obs):
    from compress_dqn._tf import tf_keras

    return tf_keras.Model(model.input, model.get_layer(layer_name).output)(obs).numpy()
