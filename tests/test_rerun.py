"""A rerun that changes only what is built from the baseline extends the run instead of refusing it."""

from __future__ import annotations

import json

import pytest

from conftest import NO_TF_MEMORY as CHEAP  # no test here reads a memory figure
from conftest import TINY

ONE = "variants=[{name: f16, quantize: {mode: float16}}]"
TWO = "variants=[{name: f16, quantize: {mode: float16}}, {name: dyn, quantize: {mode: dynamic}}]"
CHANGED = "variants=[{name: f16, quantize: {mode: dynamic}}]"


def _stages(run_dir):
    return json.loads((run_dir / "stages.json").read_text())


@pytest.mark.slow
def test_adding_a_variant_builds_only_it_and_changing_one_rebuilds_it(tmp_path):
    from compress_dqn.errors import UserError
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.pipeline import run

    out, logs = tmp_path / "run", []
    run(load_recipe(TINY, [ONE, CHEAP]), out, quiet=True, log=lambda m: None)
    first = _stages(out)
    tflite = (out / "variants" / "f16" / "policy.tflite").stat().st_mtime_ns

    outcome = run(load_recipe(TINY, [TWO, CHEAP, "eval.max_episodes=10"]), out, quiet=True, log=logs.append)
    again = _stages(out)
    assert outcome.resumed and [v.name for v in outcome.results.variants] == ["baseline", "f16", "dyn"]
    for key in ("train", "evaluate", "variant:f16", "measure:f16"):  # the baseline and f16 were not redone
        assert again[key] == first[key]
    assert (out / "variants" / "f16" / "policy.tflite").stat().st_mtime_ns == tflite
    assert "variant:dyn" in again and "max_episodes: 10" in (out / "recipe.yaml").read_text()
    assert any("new: dyn" in line for line in logs)

    run(load_recipe(TINY, [CHANGED, CHEAP]), out, quiet=True, log=lambda m: None)  # f16 redefined, dyn dropped
    changed = _stages(out)
    assert changed["variant:f16"]["compression"]["quantize"]["mode"] == "dynamic"
    assert "variant:dyn" not in changed and not (out / "variants" / "dyn").exists()
    assert changed["train"] == first["train"]

    with pytest.raises(UserError, match=r"different recipe \(train.gamma: 0.99 -> 0.5\): these change the baseline"):
        run(load_recipe(TINY, [CHANGED, CHEAP, "train.gamma=0.5"]), out, quiet=True, log=lambda m: None)


def test_a_refused_rerun_names_the_keys_not_the_values_of_long_ones(tmp_path):
    from compress_dqn.errors import UserError
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.rundir import prepare_run_dir

    run_dir = tmp_path / "r"
    prepare_run_dir(load_recipe(TINY, [ONE, CHEAP]), run_dir)
    (run_dir / "baseline").mkdir()
    (run_dir / "baseline" / "weights.npz").write_bytes(b"x")  # started
    changed = load_recipe(TINY, [TWO, "train.net_arch=[8, 8]", "env.kwargs={sutton_barto_reward: true}"])
    with pytest.raises(UserError) as refused:
        prepare_run_dir(changed, run_dir)
    message = str(refused.value)
    assert "\n" not in message and len(message.replace(str(run_dir), "RUN")) < 350  # the path is not the message
    assert "env.kwargs" in message and "train.net_arch: [16, 16] -> [8, 8]" in message and "variants" not in message.split("(")[1].split(")")[0]


@pytest.mark.slow
def test_a_finished_run_is_a_baseline_for_compress(tmp_path):
    """`compress RUN_DIR`: the run's network and replay, not a new training; the same baseline plays
    the same episodes."""
    from click.testing import CliRunner

    from compress_dqn.cli import main
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.pipeline import run

    source = tmp_path / "trained"
    original = run(load_recipe(TINY, [CHEAP]), source, quiet=True,
                   log=lambda m: None).results
    out = tmp_path / "compressed"
    result = CliRunner().invoke(main, ["compress", str(source), "--env", "CartPole-v1", "--variants", "ptq-int8",
                                       "--episodes", "5", "--max-episodes", "5", "--out", str(out), "--quiet",
                                       "--set", CHEAP])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["source"]["data"]["kind"] == "run replay"
    assert results["train"].get("port_check") is None  # nothing was ported
    assert results["variants"][0]["return"]["episodes"] == original.baseline.returns.episodes

    wrong = CliRunner().invoke(main, ["compress", str(source), "--env", "Acrobot-v1", "--out", str(tmp_path / "x")])
    assert wrong.exit_code == 2 and "plays CartPole-v1" in wrong.output and "--env CartPole-v1" in wrong.output


def test_a_search_rerun_with_other_evaluation_caps_decides_its_candidates_again(tmp_path):
    """search.json holds kept/lost calls made under eval.max_episodes and eval.tolerance: a rerun that
    changes them must not reuse those calls (each candidate's played episodes stay in its seed run)."""
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.rundir import prepare_run_dir

    search = "search.students=[[8]]"
    run_dir = tmp_path / "s"
    prepare_run_dir(load_recipe(TINY, [search]), run_dir)
    (run_dir / "seed-0").mkdir()
    (run_dir / "seed-0" / "stages.json").write_text("{}")
    (run_dir / "search.json").write_text("{}")
    assert prepare_run_dir(load_recipe(TINY, [search, "name=other"]), run_dir)
    assert (run_dir / "search.json").exists()  # the name changes no call
    assert prepare_run_dir(load_recipe(TINY, [search, "name=other", "eval.max_episodes=20"]), run_dir)
    assert not (run_dir / "search.json").exists()


def test_a_changed_search_keeps_the_baseline_and_rebuilds_only_candidates_it_redefines(tmp_path):
    """Another ladder on trained baselines is a rerun, not a retrain: candidates the new search
    defines as before keep their builds, others are dropped, and no kept/lost call is reused."""
    from compress_dqn.errors import UserError
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.rundir import prepare_run_dir

    run_dir = tmp_path / "seed-0"
    prepare_run_dir(load_recipe(TINY, ["search.students=[[8], [16]]"]), run_dir)
    (run_dir / "stages.json").write_text('{"train": {}, "variant:student-16-qat-int8": {}, "variant:student-8-qat-int8": {}}')
    for name in ("student-8-qat-int8", "student-16-qat-int8"):
        (run_dir / "variants" / name).mkdir(parents=True)
    (run_dir / "search.json").write_text("{}")
    logs: list[str] = []
    assert prepare_run_dir(load_recipe(TINY, ["search.students=[[8], [4]]"]), run_dir, logs.append)
    assert (run_dir / "variants" / "student-8-qat-int8").exists()
    assert not (run_dir / "variants" / "student-16-qat-int8").exists() and not (run_dir / "search.json").exists()
    assert set(json.loads((run_dir / "stages.json").read_text())) == {"train", "variant:student-8-qat-int8"}
    # not rungs never built (student-16's weight-only form), and the new rung's second form with it
    assert logs[-1].endswith("new: student-4-qat-int8, student-4-weight-only; rebuilt or dropped: student-16-qat-int8")
    assert prepare_run_dir(load_recipe(TINY, ["search.students=[[8], [4]]", "search.qat_steps=99"]), run_dir)
    assert not (run_dir / "variants" / "student-8-qat-int8").exists()  # its QAT changed
    with pytest.raises(UserError, match="train.gamma"):
        prepare_run_dir(load_recipe(TINY, ["search.students=[[8], [4]]", "search.qat_steps=99", "train.gamma=0.5"]), run_dir)


def test_only_a_run_or_its_baseline_folder_is_taken_for_a_run(tmp_path):
    """runs/x/variants is not run x; a run of several seeds is named so that the error can say which
    seed's folder to pass."""
    from compress_dqn.errors import UserError
    from compress_dqn.port.run_dir import run_env
    from compress_dqn.store.layout import RunLayout
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.rundir import prepare_run_dir

    run = tmp_path / "x"
    prepare_run_dir(load_recipe(TINY, []), run)
    (run / "stages.json").write_text("{}")
    for sub in ("baseline", "variants"):
        (run / sub).mkdir()
    find = RunLayout.find
    assert find(run).root == run and find(run / "baseline").root == run and find(run / "variants") is None
    seeds = tmp_path / "s"
    prepare_run_dir(load_recipe(TINY, ["seeds=[0, 1]"]), seeds)
    (seeds / "seed-0").mkdir()
    (seeds / "seed-0" / "stages.json").write_text("{}")
    with pytest.raises(UserError, match="pass one seed's directory"):
        run_env(seeds, "CartPole-v1")
