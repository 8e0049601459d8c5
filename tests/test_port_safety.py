"""A policy file whose pickle would run code is refused, in one line, and the code never runs."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.errors import UserError
from compress_dqn.port.baseline import load_model
from compress_dqn.port.tensor_pickle import read_state_dict

PORT = Path(__file__).resolve().parent / "data" / "port"
CARTPOLE = SimpleNamespace(env_id="CartPole-v1", obs_shape=(4,), obs_dtype=np.dtype(np.float32), n_actions=2, frame_stack=1)


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def evil_torch_file(marker: Path) -> bytes:
    """A torch.save-layout zip whose data.pkl runs os.system when pickle loads it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"fc.weight": Payload(marker)}))
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3")
    return buffer.getvalue()


def test_the_payload_is_real(tmp_path):
    """The malicious pickle does run code under plain pickle: the refusal below is not vacuous."""
    marker = tmp_path / "ran"
    with zipfile.ZipFile(io.BytesIO(evil_torch_file(marker))) as archive:
        pickle.loads(archive.read("archive/data.pkl"))
    assert marker.exists()


def test_a_state_dict_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "q.pth"
    path.write_bytes(evil_torch_file(marker))
    with pytest.raises(UserError) as caught:
        load_model(path, CARTPOLE)
    message = str(caught.value)
    assert "system" in message and "refused" in message and "\n" not in message
    assert not marker.exists()
    result = CliRunner().invoke(main, ["compress", str(path), "--env", "CartPole-v1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and result.output.startswith("error: ") and not marker.exists()
    assert not (tmp_path / "run").exists()


def test_an_sb3_zip_with_a_malicious_policy_or_vecnormalize_is_refused(tmp_path):
    marker = tmp_path / "ran"
    original = zipfile.ZipFile(PORT / "sb3_cartpole.zip")
    path = tmp_path / "model" / "dqn.zip"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        for name in original.namelist():
            archive.writestr(name, evil_torch_file(marker) if name == "policy.pth" else original.read(name))
    with pytest.raises(UserError, match=r"policy\.pth.*system.*refused"):
        load_model(path, CARTPOLE)
    path.write_bytes((PORT / "sb3_cartpole.zip").read_bytes())
    (path.parent / "vecnormalize.pkl").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UserError, match=r"vecnormalize\.pkl.*system.*refused"):
        load_model(path, CARTPOLE)
    assert not marker.exists()


def test_tensors_are_read_without_torch_exactly_as_torch_reads_them():
    import torch

    data = (PORT / "cleanrl_cartpole.cleanrl_model").read_bytes()
    ours = read_state_dict(data, "x")
    theirs = torch.load(io.BytesIO(data), weights_only=True)
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value.numpy())


def test_a_non_contiguous_tensor_is_rebuilt_from_its_strides(tmp_path):
    import torch

    path = tmp_path / "t.pt"
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"w": base.t(), "v": base[1:, ::2]}, path)  # views: strides and offsets into a shared storage
    ours = read_state_dict(path.read_bytes(), "x")
    np.testing.assert_array_equal(ours["w"], base.t().numpy())
    np.testing.assert_array_equal(ours["v"], base[1:, ::2].numpy())
