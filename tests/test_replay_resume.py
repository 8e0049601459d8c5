"""Training with replay.compress: the same run as uncompressed (same samples, bit-identical
stacks), and a crash then resume from its checkpoint equals the uninterrupted run."""

import numpy as np
import pytest

from compress_dqn.rl.callbacks import Interrupt
from compress_dqn.rl.trainer import latest_checkpoint
from compress_dqn.replay.buffer import load_replay

from test_train import CrashAt, tiny, train


@pytest.mark.slow
def test_compressed_training_equals_uncompressed_and_resumes_exactly(tmp_path):
    plain = train(tiny())
    recipe = tiny(**{"replay.compress": "zstd"})
    reference = train(recipe)
    assert reference.replay.packed is not None and plain.replay.packed is None
    for x, y in zip(plain.model.get_weights(), reference.model.get_weights()):
        np.testing.assert_array_equal(x, y)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Interrupt):
        train(recipe, ckpt_dir=ckpt, callbacks=[CrashAt(300)])
    saved = latest_checkpoint(ckpt)
    assert saved is not None
    info = reference.replay
    restored = load_replay(saved / "replay.npz", info.obs_shape, info.obs_dtype, info.n_actions)
    assert restored.packed is not None  # the checkpoint's replay.npz holds the compressed rows
    resumed = train(recipe, ckpt_dir=ckpt)
    assert 0 < resumed.resumed_from < recipe.train.total_timesteps
    assert resumed.episode_returns == reference.episode_returns
    for x, y in zip(reference.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(x, y)
