"""A .tflite is read once and packed once: one export of a policy decodes (and packs) its file once."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.deploy.tflite import reader
from compress_dqn.envs.normalization import Normalization


@pytest.fixture
def counts(monkeypatch):
    """reader.COUNTS, zeroed for the test."""
    monkeypatch.setattr(reader, "COUNTS", {"decode": 0, "pack": 0})
    return reader.COUNTS


class _Normalized:
    """A float conversion behind an input normalization: every edit of the export path runs on it
    (short tensor names, normalization ops in the graph, float q_values, the action from q_values)."""

    converts_own_model, try_sparse_format, weight_only = True, False, False

    def __init__(self, model, features: int) -> None:
        self.model = model
        self.input_normalization = Normalization(np.linspace(-1, 1, features).astype(np.float32), np.full(features, 2, np.float32))

    def tflite_model(self):
        return self.model

    def converter(self, sparse: bool = False):
        return None


def test_the_run_export_decodes_and_packs_once(tmp_path, counts):
    from compress_dqn._tf import tf_keras
    from compress_dqn.deploy.tflite.graph_input import graph_normalization
    from compress_dqn.convert.conversion import convert_policy
    from compress_dqn.rl.networks import build_q_network

    tf_keras.utils.set_random_seed(0)
    model = build_q_network((4,), 3, [8])
    info = SimpleNamespace(obs_shape=(4,), obs_dtype=np.dtype(np.float32))
    convert_policy(model, info, tmp_path, _Normalized(model, 4))
    assert counts == {"decode": 1, "pack": 1}
    assert graph_normalization((tmp_path / "policy.tflite").read_bytes()) is not None  # the edits ran


@pytest.mark.parametrize("target", ["tflite", "c", "onnx", "micro"])
def test_export_of_a_policy_decodes_its_file_once(tiny_variants_run, tmp_path, counts, target):
    """compress-dqn export's path for each target: at most one decode and one pack of the policy's
    .tflite (the C and ONNX graph reader decodes it, the micro export decodes it for its ops, its
    signature and its uint8 input; a current file needs no edit for --target tflite, so no decode).
    TFLM's LUT-compression trial reads its own copy through TFLM's model editor, outside this count."""
    from compress_dqn.deploy import micro
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.registry import export_policy

    if target == "micro" and not micro.available():
        pytest.skip("tflite-micro not installed")
    if target == "onnx":
        pytest.importorskip("onnx")
    out = tmp_path / {"tflite": "p.tflite", "onnx": "p.onnx"}.get(target, "out")
    for policy in [Path(tiny_variants_run) / "baseline" / "policy.tflite",
                   Path(tiny_variants_run) / "variants" / "ptq-int8" / "policy.tflite"]:
        counts.update(decode=0, pack=0)
        export_policy(target, policy, out, ExportOptions())
        assert counts["decode"] <= 1 and counts["pack"] <= 1, (policy, counts)
        if target != "tflite":
            assert counts["decode"] == 1, (policy, counts)
