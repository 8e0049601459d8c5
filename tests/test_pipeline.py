"""The pipeline with variants: same evaluation seeds for every variant, results.json shape, resume."""

import json
from pathlib import Path

import numpy as np
import pytest

import compress_dqn.evaluation.play as play_module
from compress_dqn.deploy import micro
from compress_dqn.run import baseline_stages, looks as looks_module, pipeline, variants as variants_module
from compress_dqn.envs.environment import make_env_from
from compress_dqn.envs.episodes import random_returns
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.run.pipeline import run
from compress_dqn.recipe.schema import load_recipe

from conftest import NO_TF_MEMORY, TINY, variant

VARIANTS = ('variants=[{name: ptq-float16, quantize: {mode: float16}}, '
            '{name: student-8-int8, student: {net_arch: [8]}, quantize: {mode: int8, calibration_samples: 50}, '
            'fine_tune: {steps: 100}}]')


@pytest.mark.slow
def test_variants_use_the_baselines_episode_seeds_undecided_ones_play_more_and_a_pool_builds_the_same(tmp_path, monkeypatch):
    """One run finished one variant at a time (spied on), and a copy of it taken after the baseline
    finished by two pool workers: the set-up of both checks is the same trained baseline."""
    import shutil

    from compress_dqn.evaluation.verdicts import Verdict
    from compress_dqn.store.manifest import run_fingerprint
    from compress_dqn.run.baseline_stages import train_baseline
    from compress_dqn.run.context import open_run, reopen_run
    from compress_dqn.run.pipeline import finish_run

    calls, plays = [], []
    real_evaluate, real_paired = play_module.evaluate, pipeline.paired_difference
    real_play = looks_module.play_unit

    def spy(act, env, episodes, seed):
        calls.append((env.id, episodes, seed))
        return real_evaluate(act, env, episodes, seed)

    def play_spy(env, tflite, n_actions, first_seed, count):
        plays.append((tflite and Path(tflite).parent.name, first_seed, count))
        return real_play(env, tflite, n_actions, first_seed, count)

    def undecided_until_20(variant, baseline, tolerance=0.01, random=None, confidence=0.95):
        out = real_paired(variant, baseline, tolerance, random, confidence)
        return out.model_copy(update={"verdict": Verdict.INCONCLUSIVE}) if len(variant) < 20 else out

    for module in (baseline_stages, variants_module):
        monkeypatch.setattr(module, "evaluate", spy)
    for module in (looks_module, pipeline):
        monkeypatch.setattr(module, "paired_difference", undecided_until_20)
    monkeypatch.setattr(looks_module, "play_unit", play_spy)
    recipe = load_recipe(TINY, [VARIANTS, "workers=2", "eval.max_episodes=20", "measure.saved_model_memory=baseline"])
    ctx, _ = open_run(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    train_baseline(ctx)
    shutil.copytree(tmp_path / "run", tmp_path / "two")
    outcome = finish_run(ctx, workers=1)
    # Baseline + 2 variants on seeds 0..4; then every look (10, 20) replays the baseline, the
    # random policy and the undecided variants on the next seeds, never the ones already played;
    # the baseline and the random policy play each look's episodes once, whichever variants are
    # paired with them.
    assert calls == [("CartPole-v1", 5, 0)] * 3
    looks = [(name, first, count) for first, count in ((5, 5), (10, 10))
             for name in ("baseline", None, "ptq-float16", "student-8-int8")]
    assert sorted(plays, key=str) == sorted(looks, key=str)

    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results == outcome.to_dict()
    assert results["eval"]["looks"] == [5, 10, 20] and results["eval"]["confidence"] == pytest.approx(1 - 0.05 / 3)
    names = [v["name"] for v in results["variants"]]
    assert names == ["baseline", "ptq-float16", "student-8-int8"]
    base, fp16, student = results["variants"]
    assert len(results["random"]["return"]["episodes"]) == 20
    assert results["random"]["return"]["episodes"] == random_returns(recipe.env, range(20), 2)
    assert base["return"]["episodes"] == real_evaluate(
        TFLitePolicy(tmp_path / "run" / base["artifacts"]["tflite"]).act, recipe.env, 20, 0).episodes
    for v in (fp16, student):
        assert len(v["return"]["episodes"]) == 20
        compared = v["return_vs_baseline"]
        assert compared == real_paired(v["return"]["episodes"], base["return"]["episodes"], 0.01,
                                       results["random"]["return"]["episodes"], 1 - 0.05 / 3).to_dict()
    assert base["action_agreement"] == base["action_agreement_decisive"] == 1.0
    assert 0.0 <= student["action_agreement"] <= 1.0 and 0.0 <= student["action_agreement_decisive"] <= 1.0
    assert student["size"]["params"] < base["size"]["params"]
    assert student["size"]["tflite_bytes"] < base["size"]["tflite_bytes"]
    assert student["compression"]["student"] == {"net_arch": [8], "activation": "relu", "conv": []}
    for v in results["variants"]:
        tflite = tmp_path / "run" / v["artifacts"]["tflite"]
        assert tflite.is_file()
        assert v["micro"]["flash_bytes"] == tflite.stat().st_size
        if not micro.available():  # the micro extra is in the test extra: CI takes the other branch
            assert v["micro"]["runs"] is None and "pip install" in v["micro"]["reason"]
    if micro.available():
        assert base["micro"]["runs"] and student["micro"]["runs"]
        assert 0 < student["micro"]["arena_bytes"] < student["micro"]["arena_bytes_with_margin"]
        assert not fp16["micro"]["runs"] and "float16 models do not run on TFLM" in fp16["micro"]["reason"]

    # The int8 student normalizes raw observations in its own graph (SUB, DIV in front of its input).
    from compress_dqn.deploy.tflite.graph_input import graph_normalization

    in_graph = graph_normalization((tmp_path / "run" / student["artifacts"]["tflite"]).read_bytes())
    assert student["compression"]["input_normalization"] == {"mean": in_graph.mean.tolist(), "std": in_graph.std.tolist(),
                                                             "scaling": "std"}
    assert graph_normalization((tmp_path / "run" / fp16["artifacts"]["tflite"]).read_bytes()) is None

    # Agreement is measured on held-out episodes, not on the evaluation's.
    assert results["eval"]["heldout_seed"] == 1_000_000
    heldout = np.load(tmp_path / "run" / "baseline" / "heldout_obs.npz")["observations"]
    assert len(heldout) < 5000  # a tiny policy's 10 short episodes: every visited state is kept
    heldout_start = make_env_from(recipe.env).reset(seed=1_000_000)[0]
    evaluation_starts = [make_env_from(recipe.env).reset(seed=s)[0] for s in range(20)]
    assert any(np.array_equal(state, heldout_start) for state in heldout)
    assert not any(np.array_equal(state, start) for state in heldout for start in evaluation_starts)

    # Rerun: every stage is done, nothing is rebuilt or replayed.
    calls.clear()
    plays.clear()
    again = run(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    assert calls == plays == [] and again.results.to_dict() == results

    # The copy, finished by a pool: each variant is built and each look's episode ranges are
    # played in pool workers (in chunks); each result is recorded by the run's own process, and
    # every byte and episode equals the one-at-a-time run's. The verdicts stay forced undecided
    # until 20 episodes (they are decided in this process); the spies, local functions, cannot be
    # sent to a worker.
    monkeypatch.setattr(looks_module, "play_unit", real_play)
    monkeypatch.setattr(variants_module, "evaluate", real_evaluate)
    finish_run(reopen_run(recipe, tmp_path / "two", quiet=True, log=lambda m: None), workers=2)
    assert run_fingerprint(tmp_path / "two") == run_fingerprint(tmp_path / "run")
    stages = json.loads((tmp_path / "two" / "stages.json").read_text())
    one = json.loads((tmp_path / "run" / "stages.json").read_text())
    for key in ("reference:10", "reference:20", "look:10:ptq-float16", "look:20:student-8-int8"):
        assert stages[key] == one[key]  # the random policy's episodes too
    # Parallel builds probe each policy's memory beside the builds (before the looks), one at a time after them.
    order, order_one = list(stages), list(one)
    names = ["baseline", *(v.name for v in recipe.variants)]
    assert max(order.index(f"memory:{n}") for n in names) < order.index("reference:10")
    assert min(order_one.index(f"memory:{n}") for n in names) > order_one.index("reference:20")
    # measure.saved_model_memory: baseline: TensorFlow's memory is probed for the baseline only, in both runs.
    for done in (stages, one):
        assert done["memory:baseline"]["saved_model"]["peak_rss"] > 0
        assert all(done[f"memory:{n}"]["saved_model"] is None and done[f"memory:{n}"]["tflite"]["peak_rss"] > 0
                   for n in names[1:])



def test_a_smaller_tflite_encoding_is_kept_only_if_it_loads_and_matches(tmp_path):
    import numpy as np

    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.rl.networks import build_q_network
    from compress_dqn.convert.conversion import same_policy

    obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    blobs = []
    for seed in (0, 1):
        from compress_dqn._tf import tf_keras

        tf_keras.utils.set_random_seed(seed)
        export_saved_model(build_q_network((4,), 2, [8]), (4,), np.float32, tmp_path / f"sm{seed}")
        blobs.append(convert_tflite(tmp_path / f"sm{seed}"))
    assert same_policy(blobs[0], blobs[0], obs)
    assert not same_policy(blobs[1], blobs[0], obs)  # loads, but another policy
    assert not same_policy(blobs[0][:100], blobs[0], obs)  # does not load


@pytest.mark.slow
def test_seeds_run_each_seed_and_aggregate_with_iqm(tmp_path):
    from compress_dqn.evaluation.verdicts import iqm
    from compress_dqn.run.seeds import run_seeds

    recipe = load_recipe(TINY, ["seeds=[0, 1]", "train.total_timesteps=300", NO_TF_MEMORY])
    outcome = run_seeds(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    per_seed = [json.loads((tmp_path / "run" / f"seed-{s}" / "results.json").read_text()) for s in (0, 1)]
    assert [load_recipe(tmp_path / "run" / f"seed-{s}" / "recipe.yaml").seed for s in (0, 1)] == [0, 1]
    (baseline,) = outcome.results.to_dict()["aggregate"]
    means = [r["variants"][0]["return"]["mean"] for r in per_seed]
    assert baseline["per_seed_mean_return"] == means
    assert baseline["iqm_return"] == iqm(means)
    lo, hi = baseline["iqm_return_ci95"]
    assert lo <= baseline["iqm_return"] <= hi
    assert "IQM" in (tmp_path / "run" / "report.md").read_text()
    assert outcome.results.runs == ["seed-0/results.json", "seed-1/results.json"]


def test_decisive_states_are_the_half_with_the_larger_action_gaps():
    from compress_dqn.run.context import decisive_states

    q = np.array([[1.0, 1.01, 0.0], [5.0, 1.0, 0.0], [2.0, 2.0, 9.0], [0.0, 0.3, 0.2]])  # gaps 0.01, 4, 7, 0.1
    assert decisive_states(q).tolist() == [False, True, True, False]


def _build_on_a_copy(recipe, finished: Path, out: Path, workers: int = 1) -> Path:
    """Build a recipe's variants on a copy of a run whose baseline stages are done (the recipe may change
    the variants only): the same baseline, not trained again. Only the builds: the tests that call it
    read the variant stages and files, not the measuring and report a run goes on to."""
    from compress_dqn.run.context import open_run
    from compress_dqn.run.variants import build_variants

    ctx, resumed = open_run(recipe, _copy(finished, out), quiet=True, log=lambda m: None)  # drops changed variants' stages
    assert resumed
    build_variants(ctx, workers)
    assert json.loads((out / "stages.json").read_text())["train"] == json.loads((finished / "stages.json").read_text())["train"]
    return out


@pytest.fixture(scope="module")
def tiny_baseline(tmp_path_factory) -> Path:
    """recipes/tiny.yaml's baseline stages, done once for the module's candidate tests (no variants): each copies
    it and builds its own variants from the same baseline (a rerun may change the variants only)."""
    from compress_dqn.run.baseline_stages import train_baseline
    from compress_dqn.run.context import open_run

    out = tmp_path_factory.mktemp("tiny-baseline") / "run"
    ctx, _ = open_run(load_recipe(TINY, [NO_TF_MEMORY]), out, quiet=True, log=lambda m: None)
    train_baseline(ctx)
    return out


def _copy(baseline: Path, out: Path) -> Path:
    import shutil

    shutil.copytree(baseline, out)
    return out


@pytest.mark.slow
def test_a_variant_with_candidates_keeps_the_best_on_fresh_episodes_the_same_bytes_as_built_alone(tmp_path, tiny_baseline):
    """candidates: {count: 3}: three builds (NAME.c0..c2, seeded by those names), each played with
    the baseline on the same fresh episodes; the best one's files are the variant's, byte for byte
    what a variant of its name builds alone, and the losers' are gone. On 2 workers the lone
    variant's candidates are built side by side in pool processes: the same bytes."""
    student = "student: {net_arch: [2]}, quantize: {mode: float16}, fine_tune: {steps: 2, learning_rate: 1e-4}"  # barely taught: seeds show
    recipe = load_recipe(TINY, [f"variants=[{{name: s, {student}, candidates: {{count: 3, episodes: 8}}}}]", NO_TF_MEMORY])
    _build_on_a_copy(recipe, tiny_baseline, tmp_path / "picked")
    picked = json.loads((tmp_path / "picked" / "stages.json").read_text())["variant:s"]["compression"]["candidates"]
    differences = picked["fresh_differences"]
    assert len(differences) == 3 and len(set(differences)) > 1  # the candidates are different builds
    assert picked["picked"] == differences.index(max(differences)) and picked["seed"] == 200000
    assert not (tmp_path / "picked" / "variants" / "s" / "candidates").exists()
    tflite = "variants/{}/policy.tflite"
    _build_on_a_copy(recipe, tiny_baseline, tmp_path / "pool", workers=2)
    assert json.loads((tmp_path / "pool" / "stages.json").read_text())["variant:s"]["compression"]["candidates"] == picked
    assert (tmp_path / "pool" / tflite.format("s")).read_bytes() == (tmp_path / "picked" / tflite.format("s")).read_bytes()
    alone = load_recipe(TINY, [f"variants=[{{name: s.c{picked['picked']}, {student}}}]", NO_TF_MEMORY])
    _build_on_a_copy(alone, tmp_path / "picked", tmp_path / "alone")  # the same baseline, not trained again
    assert (tmp_path / "picked" / tflite.format("s")).read_bytes() == \
        (tmp_path / "alone" / tflite.format(f"s.c{picked['picked']}")).read_bytes()


@pytest.mark.slow
def test_candidates_qat_teachers_quantize_each_float_build_once_per_teacher_and_pick_among_all(tmp_path, tiny_baseline):
    """candidates: {count: 2, qat_teachers: [baseline, float]}: two float builds (seeded by
    NAME.c0, NAME.c1), each QAT'd to the baseline and to itself: four candidates, recorded by name,
    the best one kept. A teacher's build is the same bytes whether or not the other teacher's QAT
    ran before it in the same build."""
    student = ("student: {net_arch: [4]}, fine_tune: {steps: 30, learning_rate: 1e-3}, "
               "quantize: {mode: qat, qat_steps: 20}")
    teachers = "candidates: {count: 2, episodes: 8, qat_teachers: [baseline, float]}"
    recipe = load_recipe(TINY, [f"variants=[{{name: s, {student}, {teachers}}}]", NO_TF_MEMORY])
    _build_on_a_copy(recipe, tiny_baseline, tmp_path / "both")
    picked = json.loads((tmp_path / "both" / "stages.json").read_text())["variant:s"]["compression"]["candidates"]
    assert picked["builds"] == ["s.c0.baseline", "s.c0.float", "s.c1.baseline", "s.c1.float"]
    assert picked["qat_teachers"] == ["baseline", "float"] and len(picked["fresh_differences"]) == 4
    assert picked["picked"] == picked["fresh_differences"].index(max(picked["fresh_differences"]))
    assert not (tmp_path / "both" / "variants" / "s" / "candidates").exists()
    assert len(set(picked["fresh_differences"])) > 1  # different builds
    # The float teacher alone: the same float builds and the same QAT, so the same returns.
    alone = load_recipe(TINY, [f"variants=[{{name: s, {student}, candidates: {{count: 2, episodes: 8, "
                               "qat_teachers: [float]}}]", NO_TF_MEMORY])
    _build_on_a_copy(alone, tmp_path / "both", tmp_path / "alone")
    alone_pick = json.loads((tmp_path / "alone" / "stages.json").read_text())["variant:s"]["compression"]["candidates"]
    assert alone_pick["builds"] == ["s.c0.float", "s.c1.float"]
    assert alone_pick["fresh_differences"] == picked["fresh_differences"][1::2]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("workers", [2, 1])
def test_a_run_starts_its_build_workers_before_training_and_builds_in_them(tmp_path, monkeypatch, workers):
    """The pool's workers import TensorFlow while the baseline trains (one core is free), not after."""
    from compress_dqn.run import variants

    events, started = [], []
    real_start = variants.start_local_pool

    def start(n, warm):
        assert warm is variants.warm_build_worker  # the workers' TensorFlow import
        started.append(real_start(n, int))  # a real pool, without the 5 s import the order does not need
        events.append(("start", n))
        return started[-1]

    def build(ctx, workers=1, pool=None):
        events.append(("build", workers, pool is not None and pool is started[0]))

    def finish(ctx, search=None, workers=1):
        events.append(("finish", workers, bool(started) and started[0]._shutdown_thread))
        raise _Stop

    monkeypatch.setattr(variants, "start_local_pool", start)
    monkeypatch.setattr(pipeline, "train_baseline", lambda ctx: events.append(("train",)))
    monkeypatch.setattr(pipeline, "build_variants", build)
    monkeypatch.setattr(pipeline, "finish_run", finish)
    with pytest.raises(_Stop):
        run(load_recipe(TINY, [VARIANTS, f"workers={workers}"]), tmp_path / "run", quiet=True, log=lambda m: None)
    if workers == 1:
        assert events == [("train",), ("build", 1, False), ("finish", 1, False)]  # one at a time, in this process
    else:  # the pool is shut down once the builds are done: its idle workers hold TensorFlow's memory
        assert events == [("start", 2), ("train",), ("build", 2, True), ("finish", 2, True)]


def test_a_failed_memory_probe_keeps_the_variant_it_follows(monkeypatch):
    """A pool unit builds, then probes: a probe that fails (a killed or timed-out process) must
    not take the finished build down with it; probe_memory tries the probe again later."""
    from compress_dqn.run import variants

    def failing_probe(folder, saved_model):
        raise RuntimeError(f"memory probe for {folder} failed: killed")

    built = object()  # what the build returned, passed through untouched
    monkeypatch.setattr(variants, "variant_unit", lambda *args: built)
    monkeypatch.setattr(variants, "probe_policy_memory", failing_probe)
    out = variants.variant_and_memory_unit(None, "/tmp/run", variant(None, name="ptq-int8", quantize={"mode": "int8"}), True, True)
    assert out == (built, None)


def test_a_variant_unit_probes_tensorflow_memory_only_where_the_recipe_asks(monkeypatch):
    """Every policy's TFLite memory is probed; its SavedModel's (a TensorFlow import each) for every
    policy by default, for the baseline only with measure.saved_model_memory: baseline, for none with none."""
    from compress_dqn.run import measuring, variants

    probed = []
    probe = {"runtime": "tflite", "steps": 1, "process_baseline_rss": 1, "peak_rss": 2, "policy_rss": 1,
             "imports_tensorflow": False}
    monkeypatch.setattr(measuring, "measure_memory", lambda path, runtime: probed.append((path.name, runtime)) or probe)
    monkeypatch.setattr(variants, "variant_unit", lambda *args: None)
    _, memory = variants.variant_and_memory_unit(None, "/tmp/run", variant(None, name="ptq-int8", quantize={"mode": "int8"}), True, False)
    assert memory.tflite.peak_rss == 2 and memory.saved_model is None and probed == [("policy.tflite", "tflite")]
    probed.clear()
    variants.variant_and_memory_unit(None, "/tmp/run", variant(None, name="ptq-int8", quantize={"mode": "int8"}), True, True)
    assert probed == [("policy.tflite", "tflite"), ("saved_model", "saved_model")]

    default = load_recipe(TINY, [VARIANTS])
    only_baseline = load_recipe(TINY, [VARIANTS, "measure.saved_model_memory=baseline"])
    assert all(measuring.probes_saved_model(default, n) for n in ("baseline", "ptq-float16", "student-8-int8"))
    assert measuring.probes_saved_model(only_baseline, "baseline")
    assert not any(measuring.probes_saved_model(only_baseline, n) for n in ("ptq-float16", "student-8-int8"))
    none = load_recipe(TINY, [VARIANTS, "measure.saved_model_memory=none"])
    assert not any(measuring.probes_saved_model(none, n) for n in ("baseline", "ptq-float16", "student-8-int8"))


def test_parallel_builds_start_the_costliest_first_counting_a_clustering_step_dearer():
    """The demo's order: the student (50k steps), pqat-90-int8 (6k pruning + 3k pruning-preserving
    QAT steps), then cluster-16, whose 3k clustering steps cost more than the 6k steps of either
    pruning build; the post-training quantizations (no steps) last, in recipe order."""
    from compress_dqn.compress.recovery import build_cost
    from compress_dqn.recipe.schema import load_recipe

    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / "cartpole.yaml")
    order = sorted(recipe.variants, key=lambda v: -build_cost(v, recipe))
    assert [v.name for v in order] == [
        "student-32x32-qat-int8", "pqat-90-int8", "cluster-16", "prune-80", "prune-90-int8", "qat-int8",
        "ptq-dynamic", "ptq-float16", "ptq-int8",
    ]


@pytest.mark.slow
def test_a_dueling_baseline_is_exported_and_compressed_as_the_plain_network(tmp_path):
    """train.dueling changes how the baseline learns, not what it is: weights.npz holds the plain
    network (one Dense head), which the TFLite policy computes and a variant compresses."""
    from compress_dqn.envs.environment import env_info
    from compress_dqn.fileio import load_arrays
    from compress_dqn.rl.networks import network_for

    recipe = load_recipe(TINY, ["train.dueling=true", "train.total_timesteps=300",
                                "variants=[{name: ptq-float16, quantize: {mode: float16}}]", NO_TF_MEMORY])
    run(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    base = tmp_path / "run" / "baseline"
    env = make_env_from(recipe.env)
    plain = network_for(env_info(env, recipe.env.id), recipe.train)
    plain.set_weights(load_arrays(base / "weights.npz"))
    states = np.load(base / "heldout_obs.npz")["observations"][:100]
    np.testing.assert_allclose(TFLitePolicy(base / "policy.tflite").q_values(states), plain(states).numpy(), rtol=1e-4, atol=1e-4)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [v["name"] for v in results["variants"]] == ["baseline", "ptq-float16"]
    # measure.saved_model_memory: none: no policy's TensorFlow memory is probed, every TFLite one is.
    assert all(v["memory_bytes"]["cpu_rss"]["saved_model"] is None and v["memory_bytes"]["cpu_rss"]["tflite"]["peak_rss"] > 0
               for v in results["variants"])


def test_a_lone_variant_built_several_times_counts_its_candidates_as_builds_for_the_workers():
    """variant_workers: a single variant with candidates: {count: 3} keeps 2 workers busy (its
    candidates side by side), a plain one keeps 1; never more than the recipe's workers."""
    from types import SimpleNamespace

    from compress_dqn.envs.environment import probe_env

    student = "student: {net_arch: [2]}, fine_tune: {steps: 2, learning_rate: 1e-4}"
    for extra, workers, expected in (("", 2, 1), (", candidates: {count: 3}", 2, 2), (", candidates: {count: 3}", 1, 1)):
        recipe = load_recipe(TINY, [f"variants=[{{name: s, {student}{extra}}}]", f"workers={workers}"])
        ctx = SimpleNamespace(recipe=recipe, info=probe_env(recipe.env))
        assert variants_module.variant_workers(ctx) == expected
