"""Named compression variants for `compress-dqn compress --variants`: the shipped recipes' choices.

Plain data, so the CLI lists them without importing TensorFlow. `keep_dense` names the layers that
pruning and clustering leave alone (the small input and output layers of an MLP).
"""

from __future__ import annotations

import copy
from typing import Any

VARIANT_PRESETS: dict[str, dict[str, Any]] = {
    "ptq-dynamic": {"quantize": {"mode": "dynamic"}},
    "ptq-float16": {"quantize": {"mode": "float16"}},
    "ptq-int8": {"quantize": {"mode": "int8"}},
    "qat-int8": {"quantize": {"mode": "qat"}, "fine_tune": {"steps": 3000, "learning_rate": 1e-4}},
    "prune-80": {"prune": {"sparsity": 0.8}, "fine_tune": {"steps": 6000, "learning_rate": 3e-4}},
    "prune-90-int8": {"prune": {"sparsity": 0.9}, "quantize": {"mode": "int8"},
                      "fine_tune": {"steps": 6000, "learning_rate": 3e-4}},
    "pqat-90-int8": {"prune": {"sparsity": 0.9}, "quantize": {"mode": "qat", "qat_steps": 3000},
                     "fine_tune": {"steps": 6000, "learning_rate": 3e-4}},
    "cluster-16": {"cluster": {"clusters": 16}, "fine_tune": {"steps": 3000, "learning_rate": 1e-4}},
    "student-32x32-qat-int8": {"student": {"net_arch": [32, 32]}, "quantize": {"mode": "qat", "qat_steps": 10000},
                               "fine_tune": {"steps": 40000, "learning_rate": 1e-3}},
}


def preset_for(name: str, keep_dense: list[str]) -> dict[str, Any]:
    """The preset's variant settings, with keep_dense excluded from pruning and clustering."""
    preset = copy.deepcopy(VARIANT_PRESETS[name])
    for technique in ("prune", "cluster"):
        if technique in preset:
            preset[technique]["exclude"] = list(keep_dense)
    return preset
