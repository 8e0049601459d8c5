"""The search's families as variant templates (issue 60): every recipe written before builds the same
ladder, rung for rung, as it did when its runs were started, so those runs resume without rebuilding.

tests/data/search_ladders_before.json holds each case's ladder (each rung's name, estimated bytes and
variant) and the search block of the recipe.yaml its run wrote, as built at commit 5969047, before
the change, by `python tests/test_search_templates.py` (`_capture`; run at a later commit it would
record that commit's ladders instead). The recipes it read are in tests/data/search_recipes_before/
(the shipped search recipes as they were then written) and tests/data/legacy-a0e684b/.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import MINATAR, TINY  # noqa: E402

import pytest  # noqa: E402

from compress_dqn.errors import UserError  # noqa: E402
from compress_dqn.recipe.presets import search_block, search_defaults  # noqa: E402
from compress_dqn.recipe.safe_yaml import read_yaml  # noqa: E402
from compress_dqn.recipe.schema import Recipe, SearchConfig, VariantConfig, load_recipe, recipe_from_data  # noqa: E402
from compress_dqn.run.ladders import ladders, variant_name  # noqa: E402

DATA = HERE / "data"
BEFORE = DATA / "search_ladders_before.json"
OLD_RECIPES = DATA / "search_recipes_before"
REWRITTEN = DATA / "search_recipes_rewritten"
"""Shipped search recipes as they were rewritten in templates, where their search has changed since
(issue 62 made minatar-breakout-search's ladder the 4-bit shrunk student, and
minatar-spaceinvaders-search's the 95% pruning with int8 activations): the rewrite is what must
build the old text's ladder, not the recipe that later replaced it."""
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


def rewritten(name: str) -> Path:
    """The shipped recipe `name` as issue 60 rewrote it in templates (REWRITTEN's copy where one is kept)."""
    frozen = REWRITTEN / f"{name}.yaml"
    return frozen if frozen.exists() else HERE.parent / "recipes" / f"{name}.yaml"


def cli_search_recipe(flat: bool) -> dict[str, Any]:
    """The recipe `compress-dqn search MODEL` builds with its defaults (cli.py's search and
    run/model_recipe.py), for an MLP (flat observations) or a MinAtar CNN."""
    env, train, keep_dense = (({"id": "CartPole-v1"}, {"net_arch": [64, 64]}, ["q_values", "hidden_0"]) if flat else
                              ({"id": "MinAtar/Breakout-v1"}, {"conv": [{"filters": 16, "kernel": 3}], "net_arch": [128]},
                               ["q_values", "conv_0"]))
    return {"name": "model-search", "env": env, "baseline": {"from": "model.zip"}, "train": train,
            "search": {"objective": "gzip_bytes", "students": [[64, 64], [32, 32], [16, 16], [8, 8]],
                       "sparsities": [0.8, 0.9, 0.95], "prune_exclude": keep_dense, **defaults_at_capture(flat)}}


def defaults_at_capture(flat: bool) -> dict[str, Any]:
    """search_defaults as they were when the ladders were captured: issue 58 has since made the
    search's MLP students fit the teacher's advantages (test_the_search_students_fit_the_advantages_on_flat_tasks_only)."""
    defaults = search_defaults(flat)
    defaults["student"]["fine_tune"].pop("advantage_weight", None)
    return defaults


def ladder_of(recipe: Recipe, shape: tuple[tuple[int, ...], int]) -> dict[str, list[dict[str, Any]]]:
    return {family: [{"name": c.variant.name, "estimated_bytes": c.estimated_bytes,
                      "variant": c.variant.model_dump(mode="json")} for c in rungs]
            for family, rungs in ladders(recipe, *shape).items()}


@functools.cache
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


@functools.cache
def _all_before() -> dict[str, Any]:
    return json.loads(BEFORE.read_text())


def _before(name: str) -> dict[str, Any]:
    before = _all_before()[name]
    if name == "defaults":
        before = _with_48x48(before)
    return before


def _with_48x48(before: dict[str, Any]) -> dict[str, Any]:
    """The default students since the capture: 48x48 joined them, between 64x64 and 32x32 (the RL Zoo's Acrobot
    agents keep the return at 64x64, not at 32x32: docs/rl-zoo.md). Every other rung is as captured."""
    before = copy.deepcopy(before)
    students = before["ladder"]["student"]
    rung = copy.deepcopy(students[0])  # 64x64: the same template, another width
    rung["name"] = rung["variant"]["name"] = "student-48x48-qat-int8"
    rung["variant"]["student"]["net_arch"] = [48, 48]
    rung["estimated_bytes"] = float(4 * 48 + 48 * 48 + 48 * 2)  # CartPole's 4 inputs and 2 actions, int8
    students.insert(1, rung)
    before["recipe_yaml_search"]["students"].insert(1, [48, 48])
    return before


ADDED_SINCE = {"student": {"from_teacher": None}, "fine_tune": {"margin_weight": 0.0}, "quantize": {"equalize": False}}
"""Variant keys added after the capture, at the default that leaves a rung as it was built then."""


def _built(recipe: Recipe, shape: tuple[tuple[int, ...], int]) -> dict[str, Any]:
    built = json.loads(json.dumps(ladder_of(recipe, shape)))  # as JSON holds it: tuples as lists
    for rung in (r for rungs in built.values() for r in rungs):
        for block, added in ADDED_SINCE.items():
            for key, default in added.items():
                if rung["variant"].get(block) and rung["variant"][block].get(key, default) == default:
                    rung["variant"][block].pop(key, None)
    return built


@pytest.mark.parametrize("name", sorted(json.loads(BEFORE.read_text())))
def test_a_recipe_written_before_builds_the_ladder_it_built_then(name):
    """The old text of each shipped search recipe, the a0e684b one, compress-dqn search's defaults
    and each old key: every rung named, estimated and defined as before."""
    recipe, shape = _cases()[name]
    assert _built(recipe, shape) == _before(name)["ladder"]


@pytest.mark.parametrize("name", sorted(json.loads(BEFORE.read_text())))
def test_a_run_started_before_reads_its_recipe_yaml_as_the_same_recipe(name):
    """A run's recipe.yaml holds every search key of its day: read back, it is the recipe the old
    text is now (so a rerun finds no difference and keeps its search log and builds)."""
    recipe, shape = _cases()[name]
    stored = recipe_from_data({**recipe.to_dict(), "search": _before(name)["recipe_yaml_search"]})
    assert stored.to_dict() == recipe.to_dict()
    assert _built(stored, shape) == _before(name)["ladder"]


def test_the_shipped_search_recipes_are_written_in_templates_and_build_their_old_ladders():
    shipped = {path.stem for path in (HERE.parent / "recipes").glob("*.yaml") if (read_yaml(path) or {}).get("search")}
    assert shipped == set(SHIPPED)
    for name, shape in SHIPPED.items():
        assert not set(read_yaml(HERE.parent / "recipes" / f"{name}.yaml")["search"]) & OLD_KEYS, f"{name}: old keys"
        path = rewritten(name)
        assert not set(read_yaml(path)["search"]) & OLD_KEYS, f"{name}: written in the old keys"
        recipe = load_recipe(path)
        assert recipe.to_dict() == load_recipe(OLD_RECIPES / f"{name}.yaml").to_dict(), name
        assert _built(recipe, shape) == _before(f"recipes/{name}.yaml")["ladder"], name


def test_every_rung_is_named_from_its_settings():
    for case in _all_before().values():
        for rungs in case["ladder"].values():
            for rung in rungs:
                assert variant_name(VariantConfig.model_validate(rung["variant"])) == rung["name"]


def test_the_a0e684b_search_run_resumes_without_rebuilding(tmp_path):
    """Its recipe.yaml (the old keys, every one written out) reads as the recipe that started it, so
    a rerun of legacy-search.yaml changes nothing: the search log and every build are kept, each
    under the name the ladder still gives it."""
    from compress_dqn.run.ladders import candidate_variants
    from compress_dqn.run.rundir import prepare_run_dir

    run_dir = tmp_path / "search"
    shutil.copytree(LEGACY / "search", run_dir)
    recipe = load_recipe(LEGACY / "legacy-search.yaml")
    found = [v.name for v in candidate_variants(recipe.search)]
    names, second = found[:3], found[3:]
    assert names == ["student-8-qat-int8", "student-4-qat-int8", "prune-50-int8"]
    assert second == ["student-8-weight-only", "student-4-weight-only"]  # each student's form where QAT loses: new
    assert list(json.loads((run_dir / "search.json").read_text())["tried"]) == names
    stages = json.loads((run_dir / "seed-0" / "stages.json").read_text())
    assert {f"variant:{name}" for name in names} <= set(stages)
    logs: list[str] = []
    assert prepare_run_dir(recipe, run_dir, logs.append)  # resumed
    assert logs == []  # no difference: nothing rebuilt or dropped
    assert (run_dir / "search.json").read_bytes() == (LEGACY / "search" / "search.json").read_bytes()
    assert (run_dir / "recipe.yaml").read_bytes() == (LEGACY / "search" / "recipe.yaml").read_bytes()
    assert json.loads((run_dir / "seed-0" / "stages.json").read_text()) == stages


QAT = "mode: qat, qat_steps: 5000, qat_learning_rate: 1e-4"
NEW_FORM = {
    "float-heads": [f"search={{students: [{CNN_STUDENT}], student: {{quantize: {{{QAT}, float_head: true}}}}}}"],
    "self": [f"search={{students: [{CNN_STUDENT}], student: {{quantize: {{{QAT}, float_head: true, qat_teacher: float}}}}}}"],
    "both": [f"search={{students: [{CNN_STUDENT}], student: {{quantize: {{{QAT}, float_head: true}}, "
             "candidates: {count: 2, qat_teachers: [baseline, float]}}}"],
    "cluster": [f"search={{students: [{CNN_STUDENT}, [32, 32]], student: {{quantize: {{{QAT}, float_head: true}}, "
                "cluster: {clusters: 8, exclude: [conv_0, q_values], steps: 400, learning_rate: 1e-4}}}"],
    "kernel-bits": [f"search={{students: [{CNN_STUDENT}], student: {{quantize: {{mode: qat, qat_steps: 70, "
                    "qat_learning_rate: 2e-4, float_head: true, kernel_bits: {hidden_0: 4, q_values: 6}}}}"],
    "student-int8": ["search={students: [[8], [4]], student: {quantize: {mode: int8}}}"],
    "student-float16": ["search={students: [[8]], student: {quantize: {mode: float16}}}"],
    "student-none": ["search={students: [[8]], student: {quantize: null, candidates: {count: 4}}}"],
    "prune-qat": ["search={students: [], sparsities: [0.95, 0.9], pruned: {prune: {exclude: [conv_0, q_values], "
                  "sparse_format: false}, quantize: {mode: qat, qat_steps: 300, qat_learning_rate: 1e-4, float_head: true}}}"],
    "prune-dynamic": ["search={students: [], sparsities: [0.95], pruned: {prune: {exclude: [conv_0, q_values]}, "
                      "quantize: {mode: dynamic}}}"],
    "prune-default": ["search={students: [], sparsities: [0.5, 0.975]}"],
    "quantized-qat": ["search={students: [[8]], student: {fine_tune: {steps: 300}, quantize: {mode: qat, qat_steps: 77, "
                      "qat_learning_rate: 1e-4, float_head: true}}, quantized_baseline: {fine_tune: {steps: 300}, "
                      "quantize: {mode: qat, qat_steps: 77, qat_learning_rate: 1e-4}}}"],
    "quantized-int8": ["search={students: [], quantized_baseline: {quantize: {mode: int8}}}"],
    "defaults": ["search={}"],
    "set-fine-tune": ["search.students=[[8]]", "search.student.fine_tune.steps=300",
                      "search.student.quantize={mode: qat, qat_steps: 99, qat_learning_rate: 1e-4}"],
}
"""OLD_KEY_CASES written as templates."""


@pytest.mark.parametrize("name", sorted(NEW_FORM))
def test_the_old_keys_and_the_templates_build_the_same_ladder(name):
    path, _, shape = OLD_KEY_CASES[name]
    assert _built(load_recipe(path, NEW_FORM[name]), shape) == _before(name)["ladder"]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_an_old_key_set_on_a_rewritten_recipe_means_what_it_meant_on_the_old_text(name):
    """docs and scripts --set the old keys on the shipped recipes (search.student_fine_tune.
    select_episodes=50, search.student_quantize=int8, ...): on a template the recipe writes, the key
    edits that template as it edited the old key's block."""
    sets = [["search.student_fine_tune.select_episodes=50", "search.qat_steps=7"], ["search.student_quantize=int8"],
            ["search.qat_float_head=false", "search.student_candidates=null"], ["search.prune_quantize=dynamic"],
            ["search.prune_exclude=[q_values]", "search.prune_fine_tune.steps=10"], ["search.quantized_baseline=qat"],
            ["search.prune_quantize=qat", "search.qat_learning_rate=1e-5", "search.prune_sparse_format=true"]]
    shape = SHIPPED[name]
    for overrides in sets:
        old = load_recipe(OLD_RECIPES / f"{name}.yaml", overrides)
        new = load_recipe(rewritten(name), overrides)
        assert _built(new, shape) == _built(old, shape), overrides
        assert new.to_dict() == old.to_dict(), overrides


@pytest.mark.parametrize("search, fix", [
    # the old keys' combinations, refused as before
    ("{students: [[8]], qat_teacher: both}", "qat_teacher: both makes each QAT build two candidates: it needs "
                                             "student_quantize: qat and student_candidates"),
    ("{students: [[8]], qat_teacher: both, student_candidates: {count: 2}, student_quantize: int8}",
     "needs student_quantize: qat and student_candidates (now written student: {quantize: {mode: qat}, candidates: "
     "{qat_teachers: [baseline, float]}})"),
    ("{students: [[8]], student_quantize: int8, student_cluster: {clusters: 8}}",
     "search.student: cluster: clustered students keep their clusters through quantization-aware int8; "
     "set quantize: {mode: qat} or remove cluster"),
    ("{students: [[8]], student_quantize: none, student_kernel_bits: {hidden_0: 4}}",
     "student_kernel_bits: low-bit kernels are trained by QAT without clustering; set student_quantize: qat and "
     "remove student_cluster, or remove student_kernel_bits"),
    ("{students: [[8]], student_cluster: {clusters: 8}, student_kernel_bits: {hidden_0: 4}}",
     "search.student: quantize.kernel_bits: low-bit kernels are trained by QAT without clustering; remove cluster "
     "or kernel_bits"),
    # and the same on the templates
    ("{students: [[8]], student: {quantize: {mode: int8}, candidates: {qat_teachers: [baseline, float]}}}",
     "search.student: candidates.qat_teachers: QAT's teachers need quantize.mode: qat; remove it or use mode qat"),
    ("{students: [[8]], student: {quantize: null, cluster: {clusters: 8}}}", "set quantize: {mode: qat} or remove cluster"),
    ("{students: [[8]], student: {quantize: {mode: int8, kernel_bits: {hidden_0: 4}}}}",
     "search.student.quantize: kernel_bits applies to mode qat only, not int8; remove it or use mode: qat"),
    ("{students: [[8]], student: {cluster: {clusters: 8}, quantize: {mode: qat, kernel_bits: {hidden_0: 4}}}}",
     "remove cluster or kernel_bits"),
    ("{students: [], sparsities: [0.5], pruned: {cluster: {clusters: 4}}}", "search.pruned: cluster: a pruned rung "
                                                                             "is not clustered too; remove cluster"),
    ("{students: [[8]], student: {fine_tune: {method: td}}}",
     "search.student: a student learns from the baseline: fine_tune.method must be distill"),
    ("{students: [], quantized_baseline: {}}", "search.quantized_baseline: a variant needs at least one of"),
    ("{students: [], sparsities: [0.5], pruned: {prune: {sparsity: 0.5}}}", "search.pruned.prune.sparsity: unknown key"),
    ("{students: []}", "search: give students, shrunk, sparsities or quantized_baseline; nothing to try"),
])
def test_a_search_that_cannot_be_built_is_refused_in_one_line_naming_the_fix(search, fix):
    with pytest.raises(UserError) as refused:
        load_recipe(TINY, [f"search={search}"])
    assert fix in str(refused.value) and "\n" not in str(refused.value)


OLD_KEYS = {"student_quantize", "student_fine_tune", "student_candidates", "student_cluster", "student_kernel_bits",
            "prune_exclude", "prune_fine_tune", "prune_quantize", "prune_sparse_format", "qat_steps",
            "qat_learning_rate", "qat_float_head", "qat_teacher"}


@pytest.mark.parametrize("flat", [True, False])
def test_compress_dqn_search_writes_the_current_keys_and_builds_what_the_old_ones_did(flat):
    """cli.py's search writes pruned.prune.exclude, not prune_exclude: the same recipe and ladder, no old key."""
    shape, old = (CARTPOLE if flat else BREAKOUT), cli_search_recipe(flat)
    keep = old["search"]["prune_exclude"]
    block = search_block("gzip_bytes", old["search"]["students"], old["search"]["sparsities"], keep, flat)
    assert not set(block) & OLD_KEYS and block["pruned"]["prune"] == {"exclude": keep}
    before = recipe_from_data({**old, "search": {**old["search"], **search_defaults(flat)}})  # old keys, today's defaults
    after = recipe_from_data({**old, "search": block})
    assert after.to_dict() == before.to_dict()
    assert _built(after, shape) == _built(before, shape)


def test_the_search_block_holds_what_varies_and_one_template_a_family():
    """No search key twins a variant's: a new variant setting reaches every family through its template."""
    assert set(SearchConfig.model_fields) == {"objective", "students", "shrunk", "student", "sparsities", "pruned",
                                              "quantized_baseline", "max_candidates", "max_seconds"}
    assert not OLD_KEYS & set(SearchConfig.model_fields)
    variant_keys = set(VariantConfig.model_fields) - {"name"}
    family_keys = {"student": {"fallback", "fallback_candidates"}}  # how the family plays its rungs, not a variant's setting
    for template in ("student", "pruned", "quantized_baseline"):
        annotation = SearchConfig.model_fields[template].annotation
        model = annotation if isinstance(annotation, type) else annotation.__args__[0]
        assert set(model.model_fields) - family_keys.get(template, set()) <= variant_keys, template



def test_the_shrunk_family_narrows_the_baseline_built_as_the_students_are():
    """search.shrunk: structured pruning from the teacher, a family of its own (its rungs start from
    the baseline's weights, so they are not bisected with the fresh students), ranked by the gap
    unless an entry says, distilled and quantized by the student template."""
    recipe = recipe_from_data({**cli_search_recipe(True), "search": {
        "students": [[32, 32]], "shrunk": [[32, 32], {"net_arch": [16, 16], "from_teacher": "magnitude"}]}})
    built = ladders(recipe, *CARTPOLE)
    assert [c.variant.name for c in built["shrunk"]] == ["shrink-gap-32x32-qat-int8", "shrink-magnitude-16x16-qat-int8"]
    assert [c.variant.name for c in built["student"]] == ["student-32x32-qat-int8"]
    student, shrunk = built["student"][0].variant, built["shrunk"][0].variant
    assert shrunk.student.from_teacher == "gap" and student.student.from_teacher is None
    assert shrunk.model_dump(exclude={"name", "student"}) == student.model_dump(exclude={"name", "student"})
    assert built["shrunk"][0].estimated_bytes == built["student"][0].estimated_bytes



def test_the_search_students_fit_the_advantages_on_flat_tasks_only():
    """`compress-dqn search`: students distil with advantage_weight 1 on flat observations (the RL
    Zoo's agents kept their return with it, docs/rl-zoo.md), not on images (a MinAtar student lost)."""
    assert search_defaults(True)["student"]["fine_tune"]["advantage_weight"] == 1.0
    assert "advantage_weight" not in search_defaults(False)["student"]["fine_tune"]
    flat = recipe_from_data({**cli_search_recipe(True), "search": {**cli_search_recipe(True)["search"], **search_defaults(True)}})
    assert all(c.variant.fine_tune.advantage_weight == 1.0 for c in ladders(flat, *CARTPOLE)["student"])



def test_a_brought_network_is_estimated_at_its_own_shape():
    """recipe_for_model writes the brought network's widths and conv layers into train:, which the
    search's size estimates read (at the default 64x64 a 256x256 MLP's pruned rung looked 30x smaller)."""
    from compress_dqn.rl.networks import build_q_network, weight_layers
    from compress_dqn.run.model_recipe import network_shape

    class Conv:
        filters, kernel, stride = 8, 4, 2

    mlp = weight_layers(build_q_network((8,), 4, [256, 128]))
    assert network_shape(mlp) == {"net_arch": [256, 128], "conv": []}
    cnn = weight_layers(build_q_network((20, 20, 4), 3, [64], conv=[Conv()]))
    assert network_shape(cnn) == {"net_arch": [64], "conv": [{"filters": 8, "kernel": 4, "stride": 2}]}
    recipe = recipe_from_data({**cli_search_recipe(True), "train": network_shape(mlp)})
    pruned = {c.variant.name: c.estimated_bytes for c in ladders(recipe, (8,), 4)["prune"]}
    assert pruned["prune-90-int8"] > 0.1 * (256 * 128)  # hidden_1 pruned to 10%, hidden_0 and q_values dense


if __name__ == "__main__":
    _capture()
