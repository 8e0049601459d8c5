"""A damaged .tflite (cut short, or with bytes flipped) gets one line naming the file and exit code 2
from every export target and every command that reads one: one error path, not a traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.deploy import micro

POLICIES = ("baseline", "variants/ptq-int8", "variants/ptq-dynamic")


def _damaged(run: Path, tmp_path: Path) -> list[Path]:
    """Each policy cut to 3,000 bytes and with 40 bytes flipped, as a user's broken download would be."""
    files = []
    for name in POLICIES:
        data = (run / name / "policy.tflite").read_bytes()
        stem = name.replace("/", "-")
        cut, flipped = tmp_path / f"{stem}-cut.tflite", tmp_path / f"{stem}-flipped.tflite"
        cut.write_bytes(data[:3000])
        bad = bytearray(data)
        for i in np.random.default_rng(0).choice(np.arange(8, len(bad)), 40, replace=False):
            bad[i] ^= 0xFF
        flipped.write_bytes(bytes(bad))
        files += [cut, flipped]
    return files


def _commands(path: Path, out: Path) -> list[list[str]]:
    commands = [["export", str(path), "--target", "tflite", "--out", str(out / "p.tflite")],
                ["export", str(path), "--target", "c", "--out", str(out / "c")],
                ["evaluate", str(path), "--env", "CartPole-v1", "--episodes", "1"],
                ["bench", str(path), "--calls", "100", "--no-memory"]]
    if importlib.util.find_spec("onnx") is not None:
        commands.append(["export", str(path), "--target", "onnx", "--out", str(out / "p.onnx")])
    if micro.available():
        commands += [["export", str(path), "--target", "micro", "--out", str(out / "micro")],
                     ["evaluate", str(path), "--env", "CartPole-v1", "--episodes", "1", "--runtime", "micro"]]
    return commands


def test_a_damaged_policy_gets_one_line_from_every_target_and_command(tiny_variants_run, tmp_path):
    for path in _damaged(tiny_variants_run, tmp_path):
        for args in _commands(path, tmp_path / "out"):
            result = CliRunner().invoke(main, args)
            err = result.stderr
            assert result.exit_code == 2, (args, err, result.exception)
            assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, (args, err)
            assert "truncated or damaged" in err, (args, err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.*")), "nothing is written"


@pytest.mark.parametrize("target", ["c", "onnx", "micro"])
def test_the_graph_readers_refuse_bytes_cut_short_by_name(tmp_path, target):
    """No trained policy needed: a header that promises more than the file holds."""
    if target == "onnx" and importlib.util.find_spec("onnx") is None:
        pytest.skip("onnx not installed")
    if target == "micro" and not micro.available():
        pytest.skip("tflite-micro not installed")
    path = tmp_path / "cut.tflite"
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(40))
    result = CliRunner().invoke(main, ["export", str(path), "--target", target, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {path}: "), result.stderr
