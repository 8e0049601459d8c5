"""The compression search: bisection along each ladder, skipping, budget, and a tiny end-to-end run."""

from __future__ import annotations

import json

import pytest

from compress_dqn.errors import UserError
from compress_dqn.run import search as search_module
from compress_dqn.recipe.schema import load_recipe
from compress_dqn.run.ladders import ladders
from compress_dqn.run.search import SearchLog, SeedOutcome, Tried, bisect_family

from conftest import MINATAR, NO_TF_MEMORY, TINY

STUDENTS = "search.students=[[64, 64], [32, 32], [16, 16], [8, 8], [4, 4]]"
ONE_FORM = "search.student.fallback=null"
"""A student rung in its QAT form only: what the bisection tests script."""


def _fake_player(smallest_kept: int, played: list[str], sizes: dict[str, float]):
    """Candidates of width >= smallest_kept keep the return; the objective is a made-up size."""
    def play(candidate, plan):
        played.append(candidate.variant.name)
        width = candidate.variant.student.net_arch[0]
        kept = width >= smallest_kept
        return Tried(name=candidate.variant.name, family=candidate.family, estimated_bytes=candidate.estimated_bytes,
                     outcome="kept" if kept else "lost",
                     per_seed={"0": _outcome("within 1%" if kept else "worse", sizes[candidate.variant.name])},
                     objective=sizes[candidate.variant.name])
    return play


def _outcome(verdict: str, objective: float, normalized_score: float | None = 1.0) -> SeedOutcome:
    return SeedOutcome(verdict=verdict, episodes=5, difference=0.0, ci=(0.0, 0.0), margin=0.1,
                       normalized_score=normalized_score, objective=objective)


class _Plan:
    def __init__(self, recipe):
        self.recipe, self.log = recipe, lambda m: None


@pytest.mark.parametrize("smallest_kept, expected_played", [
    (16, ["student-16x16-qat-int8", "student-8x8-qat-int8"]),
    (64, ["student-16x16-qat-int8", "student-64x64-qat-int8", "student-32x32-qat-int8"]),
    (4, ["student-16x16-qat-int8", "student-8x8-qat-int8", "student-4x4-qat-int8"]),
])
def test_bisection_finds_the_smallest_kept_rung_in_log_steps(tmp_path, monkeypatch, smallest_kept, expected_played):
    recipe = load_recipe(TINY, [STUDENTS, ONE_FORM, "search.objective=params"])
    (rungs,) = ladders(recipe, (4,), 2).values()
    assert [c.variant.name for c in rungs][0] == "student-64x64-qat-int8"  # largest first
    played: list[str] = []
    sizes = {c.variant.name: c.estimated_bytes for c in rungs}
    monkeypatch.setattr(search_module, "play_candidate", _fake_player(smallest_kept, played, sizes))
    log = SearchLog(tmp_path / "search.json")
    bisect_family(rungs, _Plan(recipe), log, lambda: None)
    assert played == expected_played
    assert search_module._best(log.tried).name == f"student-{smallest_kept}x{smallest_kept}-qat-int8"
    # Resume: a second search over the same log plays nothing again.
    again: list[str] = []
    monkeypatch.setattr(search_module, "play_candidate", _fake_player(smallest_kept, again, sizes))
    bisect_family(rungs, _Plan(recipe), SearchLog(tmp_path / "search.json"), lambda: None)
    assert again == []


def _scripted_units(verdicts: dict[int, str], played: list[str], sizes: dict[str, float]):
    """map_units for the search's candidate units: each student width's verdict on its one seed, as written;
    the objective is a made-up size. play_candidate itself runs, and names each outcome."""
    def map_units(fn, units, executor, workers, address):
        assert fn is search_module.candidate_unit
        variant = units[0][2]
        played.append(variant.name)
        return [_outcome(verdicts[variant.student.net_arch[0]], sizes[variant.name])]
    return map_units


@pytest.mark.parametrize("verdicts, expected_played, winner", [
    # Every student keeps the return but 16x16 stays undecided (the dice): the search still reaches 4x4.
    ({64: "within 1%", 32: "within 1%", 16: "inconclusive", 8: "within 1%", 4: "within 1%"},
     ["student-16x16-qat-int8", "student-8x8-qat-int8", "student-4x4-qat-int8"], 4),
    # Undecided at 16x16, 8x8 worse: back up to the larger rungs, where 32x32 keeps it.
    ({64: "within 1%", 32: "within 1%", 16: "inconclusive", 8: "worse", 4: "worse"},
     ["student-16x16-qat-int8", "student-8x8-qat-int8", "student-64x64-qat-int8", "student-32x32-qat-int8"], 32),
    # Undecided at 16x16 and 32x32, worse below: 64x64.
    ({64: "better", 32: "inconclusive", 16: "inconclusive", 8: "worse", 4: "worse"},
     ["student-16x16-qat-int8", "student-8x8-qat-int8", "student-64x64-qat-int8", "student-32x32-qat-int8"], 64),
    # Nothing decided within: every rung above the lost ones is tried, and nothing wins.
    ({64: "inconclusive", 32: "inconclusive", 16: "inconclusive", 8: "worse", 4: "worse"},
     ["student-16x16-qat-int8", "student-8x8-qat-int8", "student-64x64-qat-int8", "student-32x32-qat-int8"], None),
])
def test_an_inconclusive_rung_does_not_bound_its_family(tmp_path, monkeypatch, verdicts, expected_played, winner):
    """Only a rung decided worse stops the descent; the winner is the smallest rung decided within (or better),
    and each undecided rung says what the search did about it. The first case fails on a bisection that takes
    an inconclusive rung for a lost one (it would stop at 32x32)."""
    recipe = load_recipe(TINY, [STUDENTS, ONE_FORM, "search.objective=params", "eval.max_episodes=5"])
    (rungs,) = ladders(recipe, (4,), 2).values()
    played: list[str] = []
    sizes = {c.variant.name: c.estimated_bytes for c in rungs}
    monkeypatch.setattr(search_module, "map_units", _scripted_units(verdicts, played, sizes))
    plan = search_module._Plan([(0, recipe, "seed-0")], recipe, 1, True, lambda m: None)
    log = SearchLog(tmp_path / "search.json")
    bisect_family(rungs, plan, log, lambda: None)
    assert played == expected_played
    best = search_module._best(log.tried)
    assert (best and best.name) == (winner and f"student-{winner}x{winner}-qat-int8")
    notes = {t.name: t.note for t in SearchLog(tmp_path / "search.json").tried.values() if t.outcome == "inconclusive"}
    assert notes and all(note.startswith("undecided after 5 episodes (the cap") for note in notes.values())
    if winner == 4:
        assert notes["student-16x16-qat-int8"].endswith("the smaller student-4x4-qat-int8 kept the return")
    elif winner is None:
        assert all(note.endswith("no rung of its family kept the return") for note in notes.values())
    again: list[str] = []  # resumed from search.json: nothing is played again
    monkeypatch.setattr(search_module, "map_units", _scripted_units(verdicts, again, sizes))
    bisect_family(rungs, plan, SearchLog(tmp_path / "search.json"), lambda: None)
    assert again == []


def _scripted_forms(verdicts: dict[str, str], played: list[str], sizes: dict[str, float]):
    """map_units for candidate units: each rung name's verdict on its one seed, as written (worse where unwritten)."""
    def map_units(fn, units, executor, workers, address):
        variant = units[0][2]
        played.append(variant.name)
        return [_outcome(verdicts.get(variant.name, "worse"), sizes[variant.name])]
    return map_units


@pytest.mark.parametrize("kept, expected_played, winner", [
    # QAT int8 keeps the return down to 32x32 only, weight-only int8 down to 8x8: past 32x32 each rung plays
    # its second form, and the family's answer is the weight-only 8x8.
    (["student-64x64-qat-int8", "student-32x32-qat-int8", "student-16x16-weight-only", "student-8x8-weight-only"],
     ["student-16x16-qat-int8", "student-16x16-weight-only", "student-8x8-qat-int8", "student-8x8-weight-only",
      "student-4x4-qat-int8", "student-4x4-weight-only"], "student-8x8-weight-only"),
    # Every QAT rung keeps it: no second form is built.
    (["student-16x16-qat-int8", "student-8x8-qat-int8", "student-4x4-qat-int8"],
     ["student-16x16-qat-int8", "student-8x8-qat-int8", "student-4x4-qat-int8"], "student-4x4-qat-int8"),
    # Neither form keeps 16x16: back to the larger rungs, where 32x32 keeps it in QAT int8.
    (["student-64x64-qat-int8", "student-32x32-qat-int8"],
     ["student-16x16-qat-int8", "student-16x16-weight-only", "student-64x64-qat-int8", "student-32x32-qat-int8"],
     "student-32x32-qat-int8"),
])
def test_a_rung_not_kept_in_int8_plays_its_weight_only_form(tmp_path, monkeypatch, kept, expected_played, winner):
    """The student template's fallback (weight-only int8 by default) is built only where the QAT form is not kept,
    and a rung counts as the better of its two forms."""
    recipe = load_recipe(TINY, [STUDENTS, "search.objective=params"])
    (rungs,) = ladders(recipe, (4,), 2).values()
    second = rungs[2].fallback.variant
    assert second.name == "student-16x16-weight-only" and second.quantize.mode == "weight_only"
    assert second.fine_tune == rungs[2].variant.fine_tune and second.candidates is rungs[2].variant.candidates is None
    # With candidates, more draws where the first form left the rung at the margin: 6 builds by default, or as told.
    for told, count in ([], 6), (["search.student.fallback_candidates=4"], 4):
        picked = load_recipe(TINY, [STUDENTS, "search.student.candidates={count: 3}", *told])
        (rung,) = [c for c in ladders(picked, (4,), 2)["student"] if c.variant.name == "student-16x16-qat-int8"]
        assert rung.fallback.variant.candidates == rung.variant.candidates.model_copy(update={"count": count})
    for first in ("float16", "dynamic"):  # float activations already: no second form
        floats = load_recipe(TINY, [STUDENTS, f"search.student.quantize={{mode: {first}}}"])
        assert all(c.fallback is None for c in ladders(floats, (4,), 2)["student"])
    sizes = {f.variant.name: f.estimated_bytes for c in rungs for f in (c, c.fallback)}
    played: list[str] = []
    monkeypatch.setattr(search_module, "map_units", _scripted_forms(dict.fromkeys(kept, "within 1%"), played, sizes))
    plan = search_module._Plan([(0, recipe, "seed-0")], recipe, 1, True, lambda m: None)
    bisect_family(rungs, plan, SearchLog(tmp_path / "search.json"), lambda: None)
    assert played == expected_played
    assert search_module._best(SearchLog(tmp_path / "search.json").tried).name == winner


def test_the_search_estimates_its_time_from_the_first_rung_and_reports_where_it_went():
    from compress_dqn.evaluation.results import SearchCost
    from compress_dqn.evaluation.search_section import render_search_markdown
    from compress_dqn.run.search import SearchClock

    recipe = load_recipe(TINY, [STUDENTS, "search.sparsities=[0.5, 0.9]"])
    rungs = ladders(recipe, (4,), 2)
    lines: list[str] = []
    clock = SearchClock(rungs, lines.append, started=search_module.time.monotonic() - 30.0)
    assert lines[0].startswith("[search] 7 rungs in 2 families") and "bisection plays about 5" in lines[0]
    first = Tried(name="student-16x16-qat-int8", family="student", estimated_bytes=1.0, outcome="kept", seconds=60.0,
                  per_seed={"0": _outcome("within 1%", 1.0).model_copy(update={"build_seconds": 45.0,
                                                                                 "play_seconds": 15.0})})
    clock.played(first)
    clock.played(first)  # the estimate is made once
    assert len(lines) == 2 and "build 45 s, play 15 s" in lines[1]
    assert clock.estimate == pytest.approx(30.0 + 4 * 60.0, abs=1.0)  # the time so far, then 4 more rungs like it
    search = search_module.SearchSummary(objective="gzip_bytes", tolerance=0.01, winner=first.name, winner_objective=1.0,
                                         front=[first.name], tried=[first],
                                         cost=SearchCost(wall_seconds=300.0, candidates_played=1, units=1,
                                                         estimated_seconds=clock.estimate, baseline_seconds=20.0,
                                                         build_seconds=45.0, play_seconds=15.0, finish_seconds=30.0))
    text = "\n".join(render_search_markdown(search))
    assert "300 s wall (estimated 270 s; baselines 20 s, builds 45 s, plays 15 s, finishing 30 s)" in text
    assert "| 45 / 15 |" in text


def test_a_rung_that_cannot_beat_the_best_is_skipped_unplayed_and_the_budget_stops_the_search(tmp_path, monkeypatch):
    recipe = load_recipe(TINY, [STUDENTS, ONE_FORM, "search.sparsities=[0.1, 0.5, 0.9]"])
    families = ladders(recipe, (4,), 2)
    played: list[str] = []
    sizes = {c.variant.name: c.estimated_bytes for c in families["student"]}
    monkeypatch.setattr(search_module, "play_candidate", _fake_player(8, played, sizes))
    log = SearchLog(tmp_path / "search.json")
    bisect_family(families["student"], _Plan(recipe), log, lambda: None)
    best = search_module._best(log.tried)
    assert best.name == "student-8x8-qat-int8"
    # The baseline is [16, 16]: pruned 10% or 50%, its int8 weights gzipped at GZIP_FLOOR, and where
    # they are (hidden_1's mask: 256 x H(0.5) bits), still outweigh an 8x8 int8 student (112 B);
    # pruned 90% (122 B, and 15 B of mask) they might not, so that rung plays.
    monkeypatch.setattr(search_module, "play_candidate", lambda c, plan: (played.append(c.variant.name), Tried(
        name=c.variant.name, family=c.family, estimated_bytes=c.estimated_bytes, outcome="lost",
        per_seed={"0": _outcome("worse", 1e9)}, objective=1e9))[1])
    bisect_family(families["prune"], _Plan(recipe), log, lambda: None)
    outcomes = {t.name: t.outcome for t in log.tried.values() if t.family == "prune"}
    assert outcomes["prune-50-int8"].startswith(
        "skipped: its weights alone (224 B and 32 B of where they are, at least ~144 B gzipped)")
    assert outcomes["prune-90-int8"] == "lost" and [n for n in played if n.startswith("prune")] == ["prune-90-int8"]

    budget_log = SearchLog(tmp_path / "budget.json")
    bisect_family(families["student"], _Plan(recipe), budget_log, lambda: "1 candidates played")
    assert budget_log.tried == {}


def test_search_recipe_errors_are_one_line():
    from compress_dqn.errors import UserError

    with pytest.raises(UserError, match="search: give students, shrunk, sparsities or quantized_baseline"):
        load_recipe(TINY, ["search.students=[]"])
    with pytest.raises(UserError, match=r"search.sparsities.0: 1.5 must be < 1"):
        load_recipe(TINY, ["search.sparsities=[1.5]"])


def test_student_candidates_make_each_student_rung_a_best_of_k_build_and_leave_pruning_alone():
    recipe = load_recipe(TINY, [STUDENTS, "search.sparsities=[0.9]", "search.student.candidates={count: 4, episodes: 50}"])
    rungs = ladders(recipe, (4,), 2)
    assert [c.variant.candidates.count for c in rungs["student"]] == [4] * 5
    assert {c.variant.candidates.episodes for c in rungs["student"]} == {50}
    assert rungs["prune"][0].variant.candidates is None
    assert all(c.variant.candidates is None for c in ladders(load_recipe(TINY, [STUDENTS]), (4,), 2)["student"])


def test_search_command_refuses_bad_ladders_in_one_line():
    from conftest import cli

    bad = cli("search", "model.keras", "--env", "CartPole-v1", "--students", "64xa")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "--students: '64xa' is not a student like 64x64 or c8k3-32" in bad.stderr
    bad = cli("search", "model.keras", "--env", "CartPole-v1", "--students", "c8-32")
    assert bad.returncode == 2 and "--students: 'c8-32' is not a student" in bad.stderr
    bad = cli("search", "model.keras", "--env", "CartPole-v1", "--sparsities", "0.9,x")
    assert bad.returncode == 2 and "--sparsities: '0.9,x' is not a list like 0.8,0.9,0.95" in bad.stderr


def test_a_chunk_with_fewer_seeds_than_workers_plays_its_looks_on_the_spare_ones(monkeypatch):
    """3 seeds on 2 workers: seeds 0 and 1 build and decide side by side, one look worker each;
    seed 2 runs alone and plays its looks on both workers. Ray units always get one."""
    from compress_dqn.run.search import _Plan as Plan, play_candidate

    calls = []

    def fake_map_units(fn, args, executor, workers, address):
        calls.append([a[-1] for a in args])
        return [_outcome("within 1%", 100.0) for _ in args]

    monkeypatch.setattr(search_module, "map_units", fake_map_units)
    (rungs,) = ladders(load_recipe(TINY, [STUDENTS]), (4,), 2).values()
    for executor, expected in (("local", [[1, 1], [2]]), ("ray", [[1, 1], [1]])):
        calls.clear()
        recipe = load_recipe(TINY, [STUDENTS, f"executor={executor}", "workers=2"])
        plan = Plan([(seed, {}, f"seed-{seed}") for seed in (0, 1, 2)], recipe, 2, True, lambda m: None)
        tried = play_candidate(rungs[0], plan)
        assert tried.outcome == "kept" and sorted(tried.per_seed) == ["0", "1", "2"]
        assert calls == expected


def test_a_single_seed_search_builds_every_rung_in_one_pool_started_once(monkeypatch):
    """One seed on 2 workers, rungs with candidates: one pool, started before the baseline and
    shut down after the last rung, builds every rung's candidates; each rung's unit runs in the
    search's process with it. Several seeds, Ray, one worker or no candidates start none."""
    from compress_dqn.run import variants as variants_module
    from compress_dqn.run.search import _Plan as Plan, play_candidate

    started, shut = [], []

    class Pool:
        def shutdown(self, *args, **kwargs):
            shut.append(self)

    monkeypatch.setattr(variants_module, "start_local_pool", lambda workers, warm: started.append(workers) or Pool())
    best_of_3 = "search.student.candidates={count: 3}"
    recipe = load_recipe(TINY, [STUDENTS, best_of_3, "workers=2"])
    forms = [f.variant for rung in ladders(recipe, (4,), 2)["student"] for f in (rung, rung.fallback) if f]
    assert all(v.candidates for v in forms)  # each student built 3 times (its weight-only form 6)
    for seeds, workers, told, to_build in ((3, 2, [], forms), (1, 2, ["executor=ray"], forms), (1, 1, [], forms),
                                          (1, 2, [], [v.model_copy(update={"candidates": None}) for v in forms])):
        with variants_module.search_build_pool(load_recipe(TINY, [STUDENTS, best_of_3, *told]), seeds, workers,
                                               to_build) as none:
            assert none is None
    with variants_module.search_build_pool(recipe, 1, 2, forms) as pool:
        assert started == [2] and not shut
        units = []
        monkeypatch.setattr(search_module, "candidate_unit",
                            lambda *args, pool=None: units.append((args[-1], pool)) or _outcome("within 1%", 1.0))
        monkeypatch.setattr(search_module, "map_units", lambda *args, **kwargs: pytest.fail("a rung started a pool"))
        plan = Plan([(0, recipe, "seed-0")], recipe, 1, True, lambda m: None, pool)
        for rung in ladders(recipe, (4,), 2)["student"][:3]:
            assert play_candidate(rung, plan).outcome == "kept"
    assert units == [(2, pool)] * 3 and shut == [pool]  # each rung's looks on both workers, its builds in the pool


@pytest.mark.slow
def test_a_unit_playing_its_looks_on_two_workers_computes_what_one_worker_does(tmp_path, monkeypatch):
    """One seed on two workers: the candidate's unit plays its looks (5 -> 10 -> 20 episodes,
    forced undecided until 20) in chunks on both; the search equals the one-worker search. The
    one-worker search is also the tiny end-to-end search: winner, report, resume."""
    from compress_dqn.run import looks
    from compress_dqn.evaluation.verdicts import Verdict
    from compress_dqn.run.search import run_search, search_fingerprint

    real_paired, real_decide, look_workers = search_module.paired_difference, looks.decide, []

    def spy_decide(ctx, names=None, workers=1):
        if names is not None:  # a search unit's (finish_run decides every variant)
            look_workers.append(workers)
        return real_decide(ctx, names, workers)

    monkeypatch.setattr(search_module, "decide", spy_decide)

    def undecided_until_20(variant, baseline, tolerance=0.01, random=None, confidence=0.95):
        out = real_paired(variant, baseline, tolerance, random, confidence)
        return out.model_copy(update={"verdict": Verdict.INCONCLUSIVE}) if len(variant) < 20 else out

    for module in (looks, search_module):
        monkeypatch.setattr(module, "paired_difference", undecided_until_20)
    overrides = ["search.students=[[8]]", "search.student.quantize={mode: float16}", "search.student.fine_tune.steps=300",
                 "eval.tolerance=1.0", "eval.max_episodes=20", NO_TF_MEMORY]
    outcomes = {workers: run_search(load_recipe(TINY, [*overrides, f"workers={workers}"]), tmp_path / f"w{workers}",
                                    quiet=True, log=lambda m: None) for workers in (1, 2)}
    assert look_workers == [1, 2]  # the unit of the one-worker search, then the two-worker one's
    assert search_fingerprint(tmp_path / "w2") == search_fingerprint(tmp_path / "w1")
    stages = json.loads((tmp_path / "w2" / "seed-0" / "stages.json").read_text())
    assert len(stages["look:20:student-8-float16"]["episodes"]) == 10  # the looks were played

    # The one-worker search end to end: it names a winner among the run's variants, and resumes.
    run_dir, found = tmp_path / "w1", outcomes[1].results.search
    played = [t.name for t in found.tried if t.per_seed]
    assert played and found.cost.units == len(played)
    seed_results = json.loads((run_dir / "seed-0" / "results.json").read_text())
    names = [v["name"] for v in seed_results["variants"]]
    assert names == ["baseline", *played]
    if found.winner is not None:
        assert found.winner in names and seed_results["search"]["winner"] == found.winner
        assert all(o.kind is not Verdict.WORSE for o in next(t for t in found.tried if t.name == found.winner).per_seed.values())
    report = (run_dir / "report.md").read_text()
    assert "## Search: the smallest policy within 100% of the baseline's lead on every seed" in report  # tolerance 1.0
    # Decided wider than 1%: each unit and each seed's variant also holds its verdict at 1%, on the same episodes.
    for t in (t for t in found.tried if t.per_seed):
        at_one = t.per_seed["0"].at_one_percent
        assert at_one is not None and f"0: {t.per_seed['0'].verdict} (" in report and "at 1%: " in report
        versus = next(v for v in seed_results["variants"] if v["name"] == t.name)["return_vs_baseline"]
        assert versus["at_one_percent"] == at_one.to_dict()
    assert all(a.per_seed_at_one_percent for a in outcomes[1].results.aggregate[1:])

    # A rerun finds every unit finished: no candidate is built or played again.
    def refuse(*args, **kwargs):
        raise AssertionError("a finished candidate was rebuilt")

    monkeypatch.setattr(search_module, "variant_stage", refuse)
    again = run_search(load_recipe(TINY, [*overrides, "workers=1"]), run_dir, quiet=True, log=lambda m: None)
    assert again.results.search.winner == found.winner and again.resumed


def test_the_front_offers_only_kept_candidates():
    """A lost candidate with a higher point estimate made the front, and left the winner off it."""
    from compress_dqn.run.search import pareto_names

    def tried(name, outcome, objective, score):
        verdict = "within 1%" if outcome == "kept" else "worse"
        return Tried(name=name, family="student", estimated_bytes=objective, outcome=outcome, objective=objective,
                     per_seed={"0": _outcome(verdict, objective, score), "1": _outcome(verdict, objective, score)})

    log = {t.name: t for t in [tried("big", "kept", 100.0, 1.00), tried("small", "kept", 50.0, 0.99),
                               tried("tiny-lost", "lost", 10.0, 1.02), tried("partial", "lost", 5.0, 1.0)]}
    log["partial"].per_seed.pop("1")
    assert pareto_names(log, seeds=2) == ["small", "big"]


def _cnn_student(template: str) -> list[str]:
    """An override: a search of one CNN student (8 3x3 filters, 32 units) built as the student template says."""
    return ["search={students: [{conv: [{filters: 8, kernel: 3}], net_arch: [32]}], student: " + template + "}"]


def test_float_head_students_are_named_for_it_and_weigh_their_float_heads():
    recipe = load_recipe(MINATAR, _cnn_student("{quantize: {mode: qat, float_head: true}}"))
    (rung,) = ladders(recipe, (10, 10, 4), 3)["student"]
    assert rung.variant.name == "student-c8k3-32-qat-int8-float-heads"
    assert rung.variant.quantize.float_head and rung.variant.quantize.mode == "qat"
    assert rung.estimated_bytes == 3 * 3 * 4 * 8 + 512 * 32 + 4 * 32 * 3
    (plain,) = ladders(load_recipe(MINATAR, ["search={students: [{conv: [{filters: 8, kernel: 3}], net_arch: [32]}]}"]),
                       (10, 10, 4), 3)["student"]
    assert plain.variant.name == "student-c8k3-32-qat-int8" and not plain.variant.quantize.float_head
    own_float = _cnn_student("{quantize: {mode: qat, float_head: true, qat_teacher: float}}")
    (own,) = ladders(load_recipe(MINATAR, own_float), (10, 10, 4), 3)["student"]
    assert own.variant.name == "student-c8k3-32-qat-int8-float-heads-self" and own.variant.quantize.qat_teacher == "float"
    assert plain.variant.quantize.qat_teacher == "baseline"
    (both,) = ladders(load_recipe(MINATAR, _cnn_student("{quantize: {mode: qat, float_head: true}, "
                                                                "candidates: {count: 2, qat_teachers: [baseline, float]}}")),
                      (10, 10, 4), 3)["student"]
    assert both.variant.name == "student-c8k3-32-qat-int8-float-heads" and both.variant.quantize.qat_teacher == "baseline"
    assert both.variant.candidates.qat_teachers == ["baseline", "float"] and both.variant.candidates.count == 2
    with pytest.raises(UserError, match="search.student: candidates.qat_teachers: QAT's teachers need quantize.mode: qat"):
        load_recipe(MINATAR, ["search={students: [[32]], student: {quantize: {mode: int8}, candidates: {qat_teachers: "
                              "[baseline, float]}}}"])


def test_clustered_students_are_named_for_it_keep_their_clusters_through_qat_and_weigh_fewer_bits():
    recipe = load_recipe(MINATAR, _cnn_student("{quantize: {mode: qat, float_head: true}, cluster: {clusters: 8, "
                                                    "exclude: [conv_0, q_values], steps: 400, learning_rate: 1e-4}}"))
    (rung,) = ladders(recipe, (10, 10, 4), 3)["student"]
    assert rung.variant.name == "student-c8k3-32-cl8-cqat-int8-float-heads"
    assert rung.variant.cluster.clusters == 8 and rung.variant.cluster.steps == 400
    assert rung.variant.quantize.mode == "qat" and rung.variant.quantize.preserve
    # The clustered hidden kernel at 3 bits a weight; the conv (a byte) and float heads excluded.
    assert rung.estimated_bytes == 3 * 3 * 4 * 8 + 512 * 32 * 3 / 8 + 4 * 32 * 3
    with pytest.raises(UserError, match=r"search.student: cluster: .*set quantize: \{mode: qat\} or remove cluster"):
        load_recipe(MINATAR, ["search={students: [[32]], student: {quantize: {mode: int8}, cluster: {clusters: 8}}}"])


def test_low_bit_students_are_named_for_it_and_weigh_their_bits():
    recipe = load_recipe(MINATAR, _cnn_student("{quantize: {mode: qat, float_head: true, kernel_bits: {hidden_0: 4}}}"))
    (rung,) = ladders(recipe, (10, 10, 4), 3)["student"]
    assert rung.variant.name == "student-c8k3-32-qat-int8-hidden_0-4bit-float-heads"
    assert rung.variant.quantize.kernel_bits == {"hidden_0": 4} and rung.variant.quantize.float_head
    # The hidden kernel at 4 bits a weight; the conv a byte, the float heads 4 bytes.
    assert rung.estimated_bytes == 3 * 3 * 4 * 8 + 512 * 32 * 4 / 8 + 4 * 32 * 3
    for quantize, conflict, fix in (("int8", "", "kernel_bits applies to mode qat only"),
                                    ("qat", ", cluster: {clusters: 16}", "without clustering; remove cluster or kernel_bits")):
        with pytest.raises(UserError, match=f"search.student.*{fix}"):
            load_recipe(MINATAR, _cnn_student(f"{{quantize: {{mode: {quantize}, kernel_bits: {{hidden_0: 4}}}}{conflict}}}"))
    with pytest.raises(UserError, match="kernel_bits"):
        load_recipe(MINATAR, ["search={students: [[32]], student: {quantize: {mode: qat, kernel_bits: {hidden_0: 1}}}}"])


def test_pruned_candidates_may_be_quantized_by_qat_or_dynamic_range_and_stay_dense():
    recipe = load_recipe(MINATAR, ["search={students: [], sparsities: [0.95], pruned: {prune: {exclude: [conv_0, q_values], "
                                   "sparse_format: false}, quantize: {mode: qat, float_head: true, qat_steps: 300}}}"])
    (rung,) = ladders(recipe, (10, 10, 4), 3)["prune"]
    assert rung.variant.name == "prune-95-qat-int8-float-heads"
    assert rung.variant.quantize.mode == "qat" and rung.variant.quantize.float_head and rung.variant.quantize.preserve
    assert rung.variant.quantize.qat_steps == 300
    assert rung.variant.prune.sparsity == 0.95 and not rung.variant.prune.sparse_format
    # The conv kept dense (a byte a weight), 5% of the 1024x128 kernel, the float heads at 4 bytes.
    assert rung.estimated_bytes == pytest.approx(3 * 3 * 4 * 16 + 0.05 * 1024 * 128 + 4 * 128 * 3)
    (default,) = ladders(load_recipe(MINATAR, ["search={students: [], sparsities: [0.9]}"]), (10, 10, 4), 3)["prune"]
    assert default.variant.name == "prune-90-int8" and default.variant.quantize.mode == "int8"
    assert default.variant.prune.sparse_format
    (dynamic,) = ladders(load_recipe(MINATAR, ["search={students: [], sparsities: [0.95], pruned: {quantize: {mode: dynamic}, "
                                               "prune: {exclude: [conv_0, q_values]}}}"]), (10, 10, 4), 3)["prune"]
    assert dynamic.variant.name == "prune-95-dynamic" and dynamic.variant.quantize.mode == "dynamic"
    assert dynamic.estimated_bytes == pytest.approx(3 * 3 * 4 * 16 + 0.05 * 1024 * 128 + 128 * 3)


def test_conv_students_are_named_and_sized_from_their_layers():
    """An image task's ladder: students with fewer filters and a smaller dense layer, each estimated
    from its own conv output size (valid padding), and the pruning family from the baseline's layers."""
    from compress_dqn.cli import _students
    from compress_dqn.recipe.schema import StudentConfig

    specs = _students("c8k3-32,c4k3s2-16x16,64")
    assert specs == [{"conv": [{"filters": 8, "kernel": 3, "stride": 1}], "net_arch": [32]},
                     {"conv": [{"filters": 4, "kernel": 3, "stride": 2}], "net_arch": [16, 16]}, [64]]
    recipe = load_recipe(MINATAR, [f"search={{students: {json.dumps(specs)}, sparsities: [0.9], "
                                   "pruned: {prune: {exclude: [q_values]}}}"])
    rungs = ladders(recipe, (10, 10, 4), 3)
    by_name = {c.variant.name: c for c in rungs["student"]}
    assert set(by_name) == {"student-c8k3-32-qat-int8", "student-c4k3s2-16x16-qat-int8", "student-64-qat-int8"}
    # 3x3x4x8 conv; 8x8x8 = 512 -> 32 -> 3; int8: a byte a weight.
    assert by_name["student-c8k3-32-qat-int8"].estimated_bytes == 3 * 3 * 4 * 8 + 512 * 32 + 32 * 3
    # stride 2: (10 - 3) // 2 + 1 = 4, so 4x4x4 = 64 inputs to the dense layers.
    assert by_name["student-c4k3s2-16x16-qat-int8"].estimated_bytes == 3 * 3 * 4 * 4 + 64 * 16 + 16 * 16 + 16 * 3
    assert by_name["student-64-qat-int8"].estimated_bytes == 400 * 64 + 64 * 3  # an MLP on the flat frame
    assert by_name["student-c8k3-32-qat-int8"].variant.student == StudentConfig(**specs[0])
    (pruned,) = rungs["prune"]  # the baseline: 3x3x4x16 conv, 1024 -> 128 -> 3; q_values kept dense
    assert pruned.estimated_bytes == pytest.approx(0.1 * (576 + 1024 * 128) + 128 * 3)


def test_the_report_says_what_an_open_verdict_would_need():
    """A candidate left inconclusive at the episode cap is reported with its estimate of the
    episodes that would decide it: on MinAtar a 1% margin is a fraction of a point."""
    from compress_dqn.evaluation.report import render_search_markdown

    from compress_dqn.evaluation.results import SearchSummary

    open_seed = {"verdict": "inconclusive", "episodes": 25600, "episodes_to_decide": 61234, "normalized_score": 1.0,
                 "objective": 9000.0, "difference": -0.05, "ci": [-0.3, 0.2], "margin": 0.1}
    decided = {**open_seed, "verdict": "within 1%", "episodes": 400, "episodes_to_decide": None}
    search = SearchSummary.model_validate({
        "objective": "gzip_bytes", "tolerance": 0.01, "winner": None, "winner_objective": None, "front": [],
        "cost": {"wall_seconds": 10.0, "candidates_played": 1, "units": 2},
        "tried": [{"name": "student-c8k3-32-qat-int8", "family": "student", "estimated_bytes": 16768.0,
                   "outcome": "lost", "objective": 9000.0, "per_seed": {"0": decided, "1": open_seed}}]})
    row = next(line for line in render_search_markdown(search) if line.startswith("| student-c8k3-32"))
    assert "0: within 1% (400)" in row and "1: inconclusive (25,600; ~61,234 to decide)" in row


def test_the_quantized_baseline_is_a_one_rung_family_and_names_must_not_clash(tmp_path):
    """Where no student keeps the return, the whole baseline in int8 may: quantized_baseline adds it
    (QAT with the students' fine-tune), sized as the full network. A listed variant of the same name
    but another definition is refused before any training."""
    from compress_dqn.errors import UserError
    from compress_dqn.run.search import run_search

    qat = "search.quantized_baseline={quantize: {mode: qat, qat_steps: 77}, fine_tune: {steps: 300}}"
    recipe = load_recipe(TINY, [STUDENTS, qat])
    (rung,) = ladders(recipe, (4,), 2)["quantize"]
    assert rung.variant.name == "qat-int8" and rung.variant.quantize.qat_steps == 77 and rung.variant.student is None
    assert rung.estimated_bytes == 4 * 16 + 16 * 16 + 16 * 2  # tiny's [16, 16] network, a byte a weight
    assert rung.variant.fine_tune.steps == 300
    int8 = "search.quantized_baseline={quantize: {mode: int8}}"
    assert ladders(load_recipe(TINY, [int8]), (4,), 2)["quantize"][0].variant.name == "ptq-int8"
    clash = load_recipe(TINY, [STUDENTS, qat, "variants=[{name: qat-int8, quantize: {mode: qat}}]"])
    with pytest.raises(UserError, match="qat-int8 also name"):
        run_search(clash, tmp_path / "run", quiet=True, log=lambda m: None)
    assert not (tmp_path / "run").exists()


class _Opened(Exception):
    pass


@pytest.mark.parametrize("unit", ["candidate_unit", "finish_unit"])
def test_a_search_or_seed_unit_sets_its_tensorflow_threads_before_it_opens_the_run(monkeypatch, unit):
    """A unit's builds run with the recipe's thread count, not TensorFlow's default of a thread per
    core for each of its pools: two units side by side would oversubscribe 2 cores."""
    from compress_dqn.run import context, seeds as seeds_module

    module = search_module if unit == "candidate_unit" else seeds_module
    calls: list[int | None] = []

    def threads_then_stop(threads: int | None) -> None:  # reopen_run sets them before anything else
        calls.append(threads)
        raise _Opened

    monkeypatch.setattr(context, "configure_threads", threads_then_stop)
    recipe = load_recipe(TINY, ["train.intra_op_threads=1", "variants=[{name: s, student: {net_arch: [2]}}]"])
    args = (recipe.variants[0], True) if unit == "candidate_unit" else (True, None)
    with pytest.raises(_Opened):
        getattr(module, unit)(recipe, "unused", *args)
    assert calls == [1]


def test_a_single_seed_run_sets_its_tensorflow_threads_before_it_opens_the_run(monkeypatch, tmp_path):
    """A run whose baseline is trained builds its variants in its own process: with the recipe's
    threads, as a unit would, or the same variant's bytes would depend on where it was built."""
    from compress_dqn.run import context

    calls: list[int | None] = []

    def threads_then_stop(threads: int | None) -> None:
        calls.append(threads)
        raise _Opened

    monkeypatch.setattr(context, "configure_threads", threads_then_stop)
    with pytest.raises(_Opened):
        context.open_run(load_recipe(TINY, ["train.intra_op_threads=1"]), tmp_path / "run")
    assert calls == [1] and not (tmp_path / "run").exists()
