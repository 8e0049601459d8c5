"""Named variants for `compress-dqn compress --variants`, and the search block of `compress-dqn search`.

Plain data, so the CLI lists them without importing TensorFlow. They carry what recovered the
return on LunarLander, where CartPole's settings did not (recipes/lunarlander.yaml, docs/lunarlander.md):
fine-tunes that keep the best snapshot on held-out selection episodes, learn the baseline's actions
on states the compressed policy reaches itself (student_states, DAgger: flat observations only),
decay the step size to 0, and a student kept as the best of several builds. `keep_dense` names the
layers that pruning and clustering leave alone (the small input and output layers of an MLP).
"""

from __future__ import annotations

import copy
from typing import Any, TypedDict, TypeVar

Setting = str | int | float | bool | list[str] | list[int]
"""One key's value in a recipe block (quantize.mode, fine_tune.steps, prune.exclude, student.net_arch...)."""


class VariantSettings(TypedDict, total=False):
    """A variant's recipe blocks, as a recipe's YAML holds them (recipe/variant.py checks them)."""

    quantize: dict[str, Setting]
    fine_tune: dict[str, Setting]
    prune: dict[str, Setting]
    cluster: dict[str, Setting]
    student: dict[str, Setting]
    candidates: dict[str, Setting]


class SearchSettings(TypedDict, total=False):
    """The search block's family templates (recipe/search.py checks them), and what `search` adds to them."""

    student: VariantSettings
    pruned: VariantSettings
    objective: str
    students: list[Any]
    sparsities: list[float]


SettingsT = TypeVar("SettingsT", VariantSettings, SearchSettings)

_SELECT = {"learning_rate_schedule": "linear", "select_interval": 5000, "student_states": 5000}
"""Selection of the best snapshot, DAgger states and a decaying step size, for every fine-tune."""
_RECOVER = {"steps": 40000, "learning_rate": 3e-4, **_SELECT}
"""How a pruned or clustered network recovers: the pruning ramp ends at 60% of the steps."""

VARIANT_PRESETS: dict[str, VariantSettings] = {
    "ptq-dynamic": {"quantize": {"mode": "dynamic"}},
    "ptq-float16": {"quantize": {"mode": "float16"}},
    "ptq-int8": {"quantize": {"mode": "int8"}},
    "qat-int8": {"quantize": {"mode": "qat"}, "fine_tune": {"steps": 20000, "learning_rate": 1e-4, **_SELECT}},
    "prune-80": {"prune": {"sparsity": 0.8}, "fine_tune": _RECOVER},
    "prune-90-int8": {"prune": {"sparsity": 0.9}, "quantize": {"mode": "int8"}, "fine_tune": _RECOVER},
    "pqat-90-int8": {"prune": {"sparsity": 0.9}, "quantize": {"mode": "qat", "qat_steps": 20000, "qat_learning_rate": 1e-4},
                     "fine_tune": _RECOVER},
    "cluster-16": {"cluster": {"clusters": 16}, "fine_tune": _RECOVER},
    "student-32x32-qat-int8": {"student": {"net_arch": [32, 32]},
                               "quantize": {"mode": "qat", "qat_steps": 20000, "qat_learning_rate": 3e-4},
                               "fine_tune": {"steps": 40000, "learning_rate": 1e-3, **_SELECT},
                               "candidates": {"count": 3, "episodes": 200, "seed": 200000}},
}

SEARCH_DEFAULTS: SearchSettings = {
    "student": {"fine_tune": {"steps": 40000, "learning_rate": 1e-3, "advantage_weight": 1.0, **_SELECT},
                "quantize": {"mode": "qat", "qat_steps": 20000, "qat_learning_rate": 3e-4},
                "candidates": {"count": 3, "episodes": 200, "seed": 200000}},
    "pruned": {"fine_tune": _RECOVER},
}
"""The search's student and pruning templates for `compress-dqn search` (recipes/lunarlander-search.yaml's),
the students also fitting the teacher's advantages: on the RL Zoo's agents, whose action gaps are small
next to their Q-values, that kept an int8 student's head step below their gaps (docs/rl-zoo.md)."""


def _for_task(settings: SettingsT, flat_observations: bool) -> SettingsT:
    """Student states (DAgger) and the advantage term play only flat-observation tasks: image tasks
    fine-tune without them (a MinAtar student distilled with advantage_weight 1 lost, docs/minatar.md)."""
    settings = copy.deepcopy(settings)
    if not flat_observations:
        for variant in [settings, settings.get("student") or {}, settings.get("pruned") or {}]:
            (variant.get("fine_tune") or {}).pop("student_states", None)
        ((settings.get("student") or {}).get("fine_tune") or {}).pop("advantage_weight", None)
    return settings


def preset_for(name: str, keep_dense: list[str], flat_observations: bool = True) -> VariantSettings:
    """The preset's variant settings for a task, with keep_dense excluded from pruning and clustering."""
    preset = _for_task(VARIANT_PRESETS[name], flat_observations)
    for technique in ("prune", "cluster"):
        if technique in preset:
            preset[technique]["exclude"] = list(keep_dense)
    return preset


def search_defaults(flat_observations: bool = True) -> SearchSettings:
    """SEARCH_DEFAULTS for a task (see _for_task)."""
    return _for_task(SEARCH_DEFAULTS, flat_observations)


def search_block(objective: str, students: list[Any], sparsities: list[float], keep_dense: list[str],
                 flat_observations: bool = True) -> SearchSettings:
    """The search block `compress-dqn search` writes, in the current keys: search_defaults, with
    keep_dense left dense in the pruned family (pruned.prune.exclude)."""
    block = search_defaults(flat_observations)
    block["pruned"] = {**block.get("pruned", {}), "prune": {"exclude": list(keep_dense)}}
    return {"objective": objective, "students": students, "sparsities": sparsities, **block}
