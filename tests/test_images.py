"""Image observations: MinAtar and Atari environments, CNN Q-networks, and a CNN run end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compress_dqn.envs.environment import FrameStack, env_info, make_env, rng_state, set_rng_state
from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import load_recipe

from conftest import MINATAR


def _play(env, steps: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        out.append((obs.tobytes(), reward, terminated))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append((obs.tobytes(),))
    return out


def test_minatar_gives_uint8_channels_and_resumes_exactly():
    env = make_env("MinAtar/Breakout-v1")
    info = env_info(env, "MinAtar/Breakout-v1")
    assert info.obs_shape == (10, 10, 4) and info.obs_dtype == np.uint8 and info.n_actions == 3
    assert info.input_scale == 1.0 and info.frame_stack == 1
    obs, _ = env.reset(seed=3)
    assert obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 1}
    _play(env, 50, 0)
    saved = rng_state(env)
    # Sticky actions and ball starts come from MinAtar's own RandomState: it must be restored too.
    first = _play(env, 300, 1)
    set_rng_state(env, saved)
    env.reset()
    other = make_env("MinAtar/Breakout-v1")
    other.reset(seed=99)
    set_rng_state(other, saved)
    other.reset()
    assert _play(env, 300, 1) == _play(other, 300, 1)
    assert first  # the stream after restoring continues from the saved state, not from the seed


def test_atari_preprocessing_and_channels_last_frame_stack():
    env = make_env("ALE/Pong-v5", frame_stack=4)
    info = env_info(env, "ALE/Pong-v5")
    assert info.obs_shape == (84, 84, 4) and info.obs_dtype == np.uint8 and info.frame_stack == 4
    assert info.input_scale == pytest.approx(1 / 255)
    obs, _ = env.reset(seed=0)
    assert all((obs[..., i] == obs[..., 0]).all() for i in range(4))  # padded with the reset frame
    previous = obs
    for _ in range(3):
        obs, *_ = env.step(0)
        np.testing.assert_array_equal(obs[..., :-1], previous[..., 1:])  # shifts by one frame
        previous = obs
    assert isinstance(env, FrameStack)


def test_atari_settings_only_for_ale_ids(tmp_path):
    with pytest.raises(UserError, match="env: atari preprocessing applies to Atari ids only"):
        load_recipe(MINATAR, ["env.atari={noop_max: 0}"])
    with pytest.raises(UserError, match="env.atari.frame_skip"):
        load_recipe(MINATAR, ["env.id=ALE/Pong-v5", "env.atari={frame_skip: 0}"])


def _conv_kernel_scales(path) -> list[int]:
    """How many quantization scales each CONV_2D kernel of a .tflite file carries."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    return [len(tensors[int(op["inputs"][1])]["quantization_parameters"]["scales"])
            for op in interpreter._get_ops_details() if op["op_name"] == "CONV_2D"]


def test_minatar_cnn_pipeline_end_to_end(minatar_variants_run):
    """The MinAtar recipe, shrunk (conftest's run): CNN training, frame replay, pruned + int8 + QAT variants
    (and dynamic range, float16), report."""
    from compress_dqn.deploy.litert.policy import TFLitePolicy

    run_dir = minatar_variants_run
    results = json.loads((run_dir / "results.json").read_text())
    names = [v["name"] for v in results["variants"]]
    assert names == ["baseline", "ptq-int8", "prune-90-int8", "qat-int8", "ptq-dynamic", "ptq-float16"]
    base, *variants = results["variants"]
    int8 = [v for v in variants if v["name"] in ("ptq-int8", "prune-90-int8", "qat-int8")]
    for entry in results["variants"]:
        policy = TFLitePolicy(run_dir / entry["artifacts"]["tflite"])
        assert policy.obs_shape == (10, 10, 4) and policy.input_dtype == np.uint8  # raw MinAtar input
        assert entry["latency_us"]["cpu"]["tflite"]["p50"] > 0
    for entry in variants:
        assert "verdict" in entry["return_vs_baseline"]
    for entry in int8:
        assert entry["size"]["tflite_bytes"] < base["size"]["tflite_bytes"] / 3
    sparsity = results["variants"][2]["compression"]["sparsity"]
    assert sparsity["conv_0"] > 0.85 and sparsity["hidden_0"] > 0.85
    for entry in int8:  # int8 conv kernels: one scale per output channel, PTQ and QAT alike
        # QAT computes the 1024x128 layer as a conv over the whole feature map, a scale per unit (per_channel_dense)
        expected = [16, 128] if entry["name"] == "qat-int8" else [16]
        assert _conv_kernel_scales(run_dir / entry["artifacts"]["tflite"]) == expected, entry["name"]
    # measure.c_policy: none (conftest's NO_C_FIGURES): every policy translated to C, none cross-compiled, and
    # the report says why its C columns are missing.
    from compress_dqn.deploy.c.measure import NOT_COMPILED

    for entry in results["variants"]:
        c = entry["c_policy"]
        assert c["translated"] and c["reason"] == NOT_COMPILED and c["flash_bytes"] is None, entry["name"]
        assert c["integer_only"] == (entry["name"] in ("ptq-int8", "prune-90-int8", "qat-int8")), entry["name"]
    report = (run_dir / "report.md").read_text()
    assert f"No C flash / RAM: {NOT_COMPILED}" in report and "C M4F" not in report
    from compress_dqn.run.measuring import MICRO_NOT_MEASURED

    for entry in results["variants"]:  # measure.micro: none (NO_MICRO_FIGURES): the model's flash, no arena
        micro = entry["micro"]
        assert micro["runs"] is None and micro["reason"] == MICRO_NOT_MEASURED and "arena_bytes" not in micro
        assert micro["flash_bytes"] == entry["size"]["tflite_bytes"], entry["name"]
    player = Path(__file__).resolve().parent / "outsider_player.py"
    for entry in [base, *int8]:  # raw MinAtar frames into LiteRT alone play the reported returns
        played = subprocess.run([sys.executable, str(player), str(run_dir / entry["artifacts"]["tflite"]),
                                 "MinAtar/Breakout-v1", "0", "3"], capture_output=True, text=True, check=True)
        assert json.loads(played.stdout)["returns"] == entry["return"]["episodes"], entry["name"]


def test_xla_by_default_except_convolutions_on_a_cpu():
    from compress_dqn._tf import tf, use_xla

    on_gpu = bool(tf.config.get_visible_devices("GPU"))
    assert use_xla(None, convolutional=False) is True
    assert use_xla(None, convolutional=True) is on_gpu
    assert use_xla(True, convolutional=True) is True and use_xla(False, convolutional=False) is False
