"""The search's families as variant templates (issue 60): every recipe written before builds the same
ladder, rung for rung, as it did when its runs were started, so those runs resume without rebuilding.

tests/data/search_ladders_before.json holds each case's ladder (each rung's name, estimated bytes and
variant) and the search block of the recipe.yaml its run wrote, as at commit 5969047, before the change, by `python tests/test_search_templates.py`
(`_capture`); the recipes it read are in tests/data/search_recipes_before/ (the shipped search
recipes as they were then written) and tests/data/legacy-a0e684b/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import MINATAR, TINY  # noqa: E402

from compress_dqn.recipe.presets import search_defaults  # noqa: E402
from compress_dqn.recipe.schema import Recipe, load_recipe, recipe_from_data  # noqa: E402
from compress_dqn.run.ladders import ladders  # noqa: E402

DATA = HERE / "data"
BEFORE = DATA / "search_ladders_before.json"
OLD_RECIPES = DATA / "search_recipes_before"
LEGACY = DATA / "legacy-a0e684b"
CARTPOLE, LUNAR, BREAKOUT, INVADERS = ((4,), 2), ((8,), 4), ((10, 10, 4), 3), ((10, 10, 6), 4)

CNN_STUDENT = "{conv: [{filters: 8, kernel: 3}], net_arch: [32]}"
OLD_KEY_CASES: dict[str, tuple[Path, list[str], tuple[tuple[int, ...], int]]] = {
    # name: (recipe, --set overrides in the old keys, (observation shape, actions))
    "float-heads": (MINATAR, [f"search={{students: [{CNN_STUDENT}], qat_float_head: true}}"], BREAKOUT),
    "self": (MINATAR, [f"search={{students: [{CNN_STUDENT}], qat_float_head: true, qat_teacher: float}}"], BREAKOUT),
    "both": (MINATAR, [f"search={{students: [{CNN_STUDENT}], qat_float_head: true, qat_teacher: both, "
                       "student_candidates: {count: 2}}"], BREAKOUT),
    "cluster": (MINATAR, [f"search={{students: [{CNN_STUDENT}, [32, 32]], qat_float_head: true, student_cluster: "
                          "{clusters: 8, exclude: [conv_0, q_values], steps: 400, learning_rate: 1e-4}}"], BREAKOUT),
    "kernel-bits": (MINATAR, [f"search={{students: [{CNN_STUDENT}], qat_float_head: true, student_kernel_bits: "
                              "{hidden_0: 4, q_values: 6}, qat_steps: 70, qat_learning_rate: 2e-4}"], BREAKOUT),
    "student-int8": (TINY, ["search={students: [[8], [4]], student_quantize: int8, qat_steps: 70}"], CARTPOLE),
    "student-float16": (TINY, ["search={students: [[8]], student_quantize: float16, qat_float_head: true}"], CARTPOLE),
    "student-none": (TINY, ["search={students: [[8]], student_quantize: none, student_candidates: {count: 4}}"],
                     CARTPOLE),
    "prune-qat": (MINATAR, ["search={students: [], sparsities: [0.95, 0.9], prune_exclude: [conv_0, q_values], "
                            "prune_quantize: qat, qat_float_head: true, qat_steps: 300, prune_sparse_format: false}"],
                  BREAKOUT),
    "prune-dynamic": (MINATAR, ["search={students: [], sparsities: [0.95], prune_quantize: dynamic, "
                                "prune_exclude: [conv_0, q_values]}"], BREAKOUT),
    "prune-default": (TINY, ["search={students: [], sparsities: [0.5, 0.975]}"], CARTPOLE),
    "quantized-qat": (TINY, ["search={students: [[8]], quantized_baseline: qat, qat_steps: 77, qat_float_head: true, "
                             "student_fine_tune: {steps: 300}}"], CARTPOLE),
    "quantized-int8": (TINY, ["search={students: [], quantized_baseline: int8}"], CARTPOLE),
    "defaults": (TINY, ["search={}"], CARTPOLE),
    "set-fine-tune": (TINY, ["search.students=[[8]]", "search.student_fine_tune.steps=300", "search.qat_steps=99"],
                      CARTPOLE),
}
"""Old-key combinations beyond the shipped recipes: each name suffix and each key's reach."""

SHIPPED = {"cartpole-search": CARTPOLE, "lunarlander-search": LUNAR, "minatar-breakout-search": BREAKOUT,
           "minatar-spaceinvaders-search": INVADERS}


def cli_search_recipe(flat: bool) -> dict[str, Any]:
    """The recipe `compress-dqn search MODEL` builds with its defaults (cli.py's search and
    run/model_recipe.py), for an MLP (flat observations) or a MinAtar CNN."""
    env, train, keep_dense = (({"id": "CartPole-v1"}, {"net_arch": [64, 64]}, ["q_values", "hidden_0"]) if flat else
                              ({"id": "MinAtar/Breakout-v1"}, {"conv": [{"filters": 16, "kernel": 3}], "net_arch": [128]},
                               ["q_values", "conv_0"]))
    return {"name": "model-search", "env": env, "baseline": {"from": "model.zip"}, "train": train,
            "search": {"objective": "gzip_bytes", "students": [[64, 64], [32, 32], [16, 16], [8, 8]],
                       "sparsities": [0.8, 0.9, 0.95], "prune_exclude": keep_dense, **search_defaults(flat)}}


def ladder_of(recipe: Recipe, shape: tuple[tuple[int, ...], int]) -> dict[str, list[dict[str, Any]]]:
    return {family: [{"name": c.variant.name, "estimated_bytes": c.estimated_bytes,
                      "variant": c.variant.model_dump(mode="json")} for c in rungs]
            for family, rungs in ladders(recipe, *shape).items()}


def _cases() -> dict[str, tuple[Recipe, tuple[tuple[int, ...], int]]]:
    """Every case as its old text builds it: recipe and (observation shape, actions)."""
    cases = {f"recipes/{name}.yaml": (load_recipe(OLD_RECIPES / f"{name}.yaml"), shape) for name, shape in SHIPPED.items()}
    cases["legacy-a0e684b/legacy-search.yaml"] = (load_recipe(LEGACY / "legacy-search.yaml"), CARTPOLE)
    cases["cli-search-mlp"] = (recipe_from_data(cli_search_recipe(True)), CARTPOLE)
    cases["cli-search-cnn"] = (recipe_from_data(cli_search_recipe(False)), BREAKOUT)
    cases.update({name: (load_recipe(path, overrides), shape) for name, (path, overrides, shape) in OLD_KEY_CASES.items()})
    return cases


def _capture() -> None:
    """Writes tests/data/search_ladders_before.json (run once, at the commit before the change): each
    case's ladder, and the search block of the recipe.yaml a run of it wrote then (Recipe.to_dict)."""
    ladders_before = {name: {"ladder": ladder_of(recipe, shape), "recipe_yaml_search": recipe.to_dict()["search"]}
                      for name, (recipe, shape) in _cases().items()}
    BEFORE.write_text(json.dumps(ladders_before, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    _capture()
