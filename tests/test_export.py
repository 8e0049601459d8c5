"""Keras, SavedModel and TFLite must act alike; the TFLite path must not import TensorFlow."""

import subprocess
import sys

import numpy as np
import pytest

from compress_dqn.errors import UserError
from compress_dqn.convert.conversion import convert_tflite, export_saved_model
from compress_dqn.rl.networks import NumpyActor, build_q_network
from compress_dqn.deploy.litert.policy import TFLitePolicy, check_compatible
from compress_dqn.convert.loading import load_policy
from compress_dqn.convert.saved_model import SavedModelPolicy


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from compress_dqn._tf import tf_keras

    out = tmp_path_factory.mktemp("export")
    # Seeded: unseeded, the weights follow whatever ran before in the worker, and some draws act
    # the same on every observation, which the action check below refuses as trivial.
    tf_keras.utils.set_random_seed(0)
    model = build_q_network((4,), 3, [32, 32])
    export_saved_model(model, (4,), np.float32, out / "saved_model")
    (out / "policy.tflite").write_bytes(convert_tflite(out / "saved_model"))
    return model, out


def test_same_actions_on_1000_random_observations(exported):
    model, out = exported
    obs = np.random.default_rng(0).normal(0, 2, size=(1000, 4)).astype(np.float32)
    keras_q = model(obs).numpy()
    keras_actions = keras_q.argmax(axis=1)
    saved, lite = SavedModelPolicy(out / "saved_model"), TFLitePolicy(out / "policy.tflite")
    np.testing.assert_allclose(saved.q_values(obs), keras_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lite.q_values(obs), keras_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(NumpyActor(model).q_values(obs), keras_q, rtol=1e-5, atol=1e-5)
    # Greedy actions one by one, as an agent acts (batch 1), through every runtime.
    assert [saved.act(o) for o in obs] == keras_actions.tolist()
    assert [lite.act(o) for o in obs] == keras_actions.tolist()
    assert len(set(keras_actions.tolist())) > 1  # the check is not trivially one action


def test_signature_and_slimness(exported):
    _, out = exported
    policy = load_policy(out / "saved_model")
    assert policy.obs_shape == (4,) and policy.n_actions == 3
    lite = load_policy(out / "policy.tflite")
    assert isinstance(lite, TFLitePolicy) and lite.obs_shape == (4,) and lite.n_actions == 3
    files = {p.name for p in (out / "saved_model").rglob("*")}
    assert "keras_metadata.pb" not in files  # only variables + the serving function


def test_tflite_policy_acts_without_tensorflow(exported):
    _, out = exported
    code = (
        "import sys, numpy as np\n"
        "from compress_dqn.convert.loading import load_policy\n"
        "p = load_policy(sys.argv[1])\n"
        "a = p.act(np.zeros(4, np.float32))\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
        "print(a)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(out / "policy.tflite")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in {"0", "1", "2"}


def test_bad_policy_files_get_clear_errors(tmp_path, exported):
    _, out = exported
    empty = tmp_path / "empty.tflite"
    empty.write_bytes(b"")
    png = tmp_path / "image.tflite"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    truncated = tmp_path / "cut.tflite"
    truncated.write_bytes((out / "policy.tflite").read_bytes()[:200])
    for path, fragment in [(empty, "empty or truncated"), (png, "not a TFLite flatbuffer"),
                           (truncated, "truncated or damaged"), (tmp_path / "missing.tflite", "no such file"),
                           (tmp_path, "SavedModel")]:
        with pytest.raises(UserError, match=fragment):
            load_policy(path)
    with pytest.raises(UserError, match=r"shape \(4,\) but LunarLander-v3 gives \(8,\)"):
        check_compatible(load_policy(out / "policy.tflite"), (8,), 4, "LunarLander-v3", "policy.tflite")


def test_batch_actions_equal_one_by_one_actions(exported):
    _, out = exported
    obs = np.random.default_rng(3).normal(0, 2, size=(200, 4)).astype(np.float32)
    for policy in (load_policy(out / "saved_model"), load_policy(out / "policy.tflite")):
        assert policy.actions(obs).tolist() == [policy.act(o) for o in obs]


def test_act_takes_any_observation_form_and_acts_alike(exported):
    """act()'s fast path hands the array to LiteRT unchecked: other dtypes, shapes and lists go the slow way."""
    _, out = exported
    policy = load_policy(out / "policy.tflite")
    obs = np.random.default_rng(4).normal(0, 2, size=(50, 4)).astype(np.float32)
    expected = policy.actions(obs).tolist()
    for form in (lambda o: o, lambda o: o.astype(np.float64), lambda o: o[None], lambda o: o.tolist(),
                 lambda o: np.asfortranarray(o[None])[0], lambda o: o.astype(">f4")):  # set_tensor copies raw bytes
        assert [policy.act(form(o)) for o in obs] == expected
    policy.actions(obs)  # batch 50: act() must resize back to 1
    assert [policy.act(o) for o in obs] == expected
    with pytest.raises((ValueError, UserError)):
        policy.act(np.zeros(5, np.float32))
