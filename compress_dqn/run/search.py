"""Search for the smallest policy that keeps the baseline's return on every training seed.

The recipe's `search:` block names families of candidates (distilled students of decreasing
width, the baseline pruned to increasing sparsity). Each family is a ladder ordered by size, and
return is assumed not to grow as a rung shrinks, so the search bisects each ladder for its
smallest rung that keeps the return: a kept rung sends it to the smaller half, a rung decided
worse to the larger half. A rung left undecided at the episode cap bounds nothing (its verdict is
the dice's, not the policy's): the search goes on to the smaller rungs, each a fresh build, and
comes back to the larger ones only if none of them keeps the return. A candidate is dropped as
soon as one seed's paired verdict rules it out (later seeds are not played), and a rung whose
estimated size cannot beat the best policy found so far is skipped unplayed. Every (seed,
candidate) evaluation is a unit an executor runs on its own, so the local pool and Ray give the
same results; search.json records finished candidates, and each seed's stages.json finished
builds, so a killed search resumes without redoing them.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from pydantic import BaseModel, JsonValue, ValidationError

from compress_dqn.errors import UserError
from compress_dqn.evaluation.findings import pareto_front
from compress_dqn.evaluation.results import (SearchCost, SearchMark, SearchSummary, SeedOutcome, SeedsResults, Tried,
                                             load_results)
from compress_dqn.evaluation.search_section import time_parts
from compress_dqn.evaluation.verdicts import Verdict, paired_difference
from compress_dqn.fileio import write_text_atomic
from compress_dqn.recipe.schema import Recipe, SearchConfig, VariantConfig
from compress_dqn.run.context import Stage, reopen_run, run_stages
from compress_dqn.run.executors import cpu_count, map_units
from compress_dqn.run.ladders import Candidate, candidate_variants, ladders
from compress_dqn.run.looks import RANDOM, decide
from compress_dqn.run.measuring import measure_stage
from compress_dqn.run.rundir import RunOutcome
from compress_dqn.run.seeds import baseline_unit, finish_unit, open_seeds, write_seeds_results
from compress_dqn.run.variants import search_build_pool, variant_stage
from compress_dqn.store import stage_keys as keys
from compress_dqn.store.layout import BASELINE, RunLayout
from compress_dqn.store.manifest import PolicyFingerprint, run_fingerprint
from compress_dqn.store.records import MeasureRecord, VariantRecord

__all__ = ["Tried", "SeedOutcome", "SearchLog", "SearchClock", "candidate_unit", "play_candidate", "outcome_of",
           "bisect_family", "pareto_names", "summary", "run_search", "search_fingerprint", "objective_value"]


def objective_value(built: VariantRecord, measured: MeasureRecord | None, objective: str) -> float:
    """The search objective from a variant's build record (and its measure record, for the latency objective)."""
    if objective == "gzip_bytes":
        return float(built.size.tflite_gzip_bytes)
    if objective == "params":
        return float(built.size.nonzero_params)
    return float(measured.latency_us.cpu.tflite.p50)


def candidate_unit(recipe: Recipe, seed_dir: str, variant: VariantConfig, quiet: bool,
                   look_workers: int = 1, pool: ProcessPoolExecutor | None = None) -> SeedOutcome:
    """One (seed, candidate) unit: build the candidate from that seed's baseline, evaluate it
    sequentially until its verdict is decided, and return its verdict and objective. Any executor
    can run it (pydantic records travel pickled); finished steps are stages of the seed's run.
    look_workers: processes that play its looks (the episodes, hence the verdict, are the same
    for any number); pool: the search's build pool, where the unit runs in the search's process."""
    ctx = reopen_run(recipe, Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    stages = [Stage(keys.variant(variant.name), lambda c: variant_stage(variant, c, look_workers, pool))]
    if ctx.recipe.search.objective == "latency":
        stages.append(Stage(keys.measure(variant.name), lambda c: measure_stage(variant.name, c)))
    run_stages(ctx, stages)
    started = time.perf_counter()
    played = decide(ctx, [variant.name], workers=look_workers)
    play_seconds = round(time.perf_counter() - started, 1)
    built = ctx.stages.get(keys.variant(variant.name), VariantRecord)
    episodes = played[variant.name]
    versus = paired_difference(episodes, played[BASELINE], ctx.recipe.eval.tolerance, played[RANDOM],
                               ctx.ranges.confidence)
    # The CI, margin and (for an open verdict) the episodes that would decide it: what a search
    # that ended undecided at its cap would need, in the report's words. Above a 1% tolerance, the
    # verdict at 1% on the same episodes too.
    return SeedOutcome(verdict=versus.label, episodes=len(episodes), difference=versus.mean, ci=versus.ci,
                       margin=versus.margin, episodes_to_decide=versus.episodes_to_decide,
                       normalized_score=versus.normalized_score, at_one_percent=versus.at_one_percent,
                       objective=objective_value(built, ctx.stages.find(keys.measure(variant.name), MeasureRecord),
                                                 ctx.recipe.search.objective),
                       build_seconds=built.compression.build_seconds, play_seconds=play_seconds)


class SearchLog:
    """search.json: each finished candidate's outcome, written atomically after each one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tried: dict[str, Tried] = _read_log(path) if path.exists() else {}

    def record(self, tried: Tried) -> Tried:
        self.tried[tried.name] = tried
        write_text_atomic(self.path, json.dumps({"tried": {name: t.to_dict() for name, t in self.tried.items()}}, indent=2))
        return tried


class _LogFile(BaseModel):
    """search.json as written: each finished candidate by name."""

    tried: dict[str, Tried]


def _read_log(path: Path) -> dict[str, Tried]:
    """search.json's candidates, or the one-line error that says how to start the search afresh."""
    try:
        return _LogFile.model_validate_json(path.read_bytes()).tried
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "its top level"
        raise UserError(f"{path}: not a search log ({where}: {first['msg']}); delete it to search afresh") from None


@dataclass
class _Plan:
    """What the search runs on: each seed's recipe and directory, and the executor."""

    seeds: list[tuple[int, Recipe, str]]
    recipe: Recipe
    workers: int
    quiet: bool
    log: Callable[[str], None]
    pool: ProcessPoolExecutor | None = None  # a single seed's build pool, kept across rungs


def play_candidate(candidate: Candidate, plan: _Plan) -> Tried:
    """Evaluate a candidate seed by seed (workers seeds at a time), stopping at the first seed
    whose verdict rules it out."""
    variant = candidate.variant
    started = time.perf_counter()
    per_seed: dict[str, SeedOutcome] = {}
    for start in range(0, len(plan.seeds), plan.workers):
        chunk = plan.seeds[start:start + plan.workers]
        # A chunk with fewer seeds than the machine's workers (3 seeds on 2, or a single seed)
        # would leave cores idle: its units play their looks on them. Local only: a Ray task
        # does not start a pool of its own.
        look_workers = max(1, (plan.recipe.workers or cpu_count()) // len(chunk)) if plan.recipe.executor == "local" else 1
        units = [(recipe, seed_dir, variant, plan.quiet, look_workers) for _, recipe, seed_dir in chunk]
        if plan.pool is not None:  # one seed: its unit runs here and builds in the search's pool
            outcomes = [candidate_unit(*units[0], pool=plan.pool)]
        else:
            outcomes = map_units(candidate_unit, units, plan.recipe.executor, plan.workers, plan.recipe.address)
        per_seed.update({str(seed): outcome for (seed, _, _), outcome in zip(chunk, outcomes)})
        if not all(o.keeps_return for o in outcomes):
            break
    outcome = outcome_of(per_seed, len(plan.seeds))
    seconds = round(time.perf_counter() - started, 1)
    verdicts = ", ".join(f"seed {s}: {o.verdict} ({o.episodes} ep)" for s, o in per_seed.items())
    plan.log(f"[search] {candidate.variant.name}: {outcome} ({verdicts}; {seconds:.0f} s)")
    return Tried(name=candidate.variant.name, family=candidate.family, estimated_bytes=candidate.estimated_bytes,
                 outcome=outcome, per_seed=per_seed, seconds=seconds,
                 objective=statistics.median(o.objective for o in per_seed.values()))


def outcome_of(per_seed: dict[str, SeedOutcome], seeds: int) -> str:
    """kept: within tolerance (or better) on every seed; lost: a seed decided it worse; inconclusive:
    neither (a seed left it undecided at the episode cap)."""
    if any(o.kind is Verdict.WORSE for o in per_seed.values()):
        return "lost"
    if len(per_seed) == seeds and all(o.keeps_return for o in per_seed.values()):
        return "kept"
    return "inconclusive"


def _best(tried: dict[str, Tried]) -> Tried | None:
    kept = [t for t in tried.values() if t.outcome == "kept"]
    return min(kept, key=lambda t: t.objective) if kept else None


def _try(candidate: Candidate, plan: _Plan, log: SearchLog, budget: Callable[[], str | None],
         clock: SearchClock | None) -> Tried | None:
    """A rung's outcome: from the log where it was tried, skipped where it cannot win, else played;
    None where the budget is spent."""
    tried = log.tried.get(candidate.variant.name)
    if tried is not None:
        return tried
    best = _best(log.tried)
    # Only the bytes objective has a bound to skip on: a rung whose weights (and where a pruned
    # one's are), gzipped as tightly as int8 kernels have been seen to gzip, still outweigh the
    # best kept policy cannot win, and the smaller half is where to look.
    floor = candidate.floor_bytes
    if best is not None and plan.recipe.search.objective == "gzip_bytes" and floor >= best.objective:
        weights = f"{candidate.estimated_bytes:,.0f} B" + (
            f" and {candidate.position_bytes:,.0f} B of where they are" if candidate.position_bytes else "")
        return log.record(Tried(name=candidate.variant.name, family=candidate.family,
                                estimated_bytes=candidate.estimated_bytes,
                                outcome=f"skipped: its weights alone ({weights}, at least ~{floor:,.0f} B gzipped) "
                                        f"outweigh {best.name} ({best.objective:,.0f} B)"))
    stop = budget()
    if stop:
        plan.log(f"[search] budget spent ({stop}): {candidate.variant.name} not played")
        return None
    tried = log.record(play_candidate(candidate, plan))
    if clock is not None:
        clock.played(tried)
    return tried


_RANK = {"lost": 0, "inconclusive": 1, "kept": 3}
"""How a rung's two forms compare: a kept one wins; a skipped one (it cannot beat the best) ranks 2."""


def _rank(tried: Tried) -> int:
    return _RANK.get(tried.outcome, 2)


def _try_rung(candidate: Candidate, plan: _Plan, log: SearchLog, budget: Callable[[], str | None],
              clock: SearchClock | None) -> Tried | None:
    """A rung's outcome: its first form's, or where that is not kept and the rung has a second form
    (Candidate.fallback), the better of the two. None where the budget is spent."""
    tried = _try(candidate, plan, log, budget, clock)
    if tried is None or candidate.fallback is None or tried.outcome not in ("lost", "inconclusive"):
        return tried
    second = _try(candidate.fallback, plan, log, budget, clock)
    return None if second is None else max((tried, second), key=_rank)


def _rung_outcome(candidate: Candidate, log: SearchLog) -> str | None:
    """The better outcome of a rung's forms in the log, or None where neither was tried."""
    forms = [log.tried.get(c.variant.name) for c in (candidate, candidate.fallback) if c is not None]
    tried = [t for t in forms if t is not None]
    return max(tried, key=_rank).outcome if tried else None


def bisect_family(rungs: list[Candidate], plan: _Plan, log: SearchLog, budget: Callable[[], str | None],
                  clock: SearchClock | None = None) -> None:
    """Smallest kept rung of one ladder (largest first), by bisection. A kept rung sends the search
    to the smaller half, a rung decided worse to the larger half; a rung with a second form
    (Candidate.fallback) plays it where the first is not kept, and counts as the better of the two.
    An inconclusive rung bounds nothing: the search goes on to the smaller half as past a kept one,
    and where no rung of the family keeps the return in the end, it bisects the rungs larger than
    the largest inconclusive one. So the family stops only at rungs decided worse, and its answer
    is the smallest rung decided within the tolerance."""
    lo, hi, top = 0, len(rungs) - 1, len(rungs)
    while True:
        while lo <= hi:
            mid = (lo + hi) // 2
            tried = _try_rung(rungs[mid], plan, log, budget, clock)
            if tried is None:
                return
            if tried.outcome == "lost":
                hi = mid - 1
            else:
                lo = mid + 1
        outcomes = [_rung_outcome(c, log) for c in rungs]
        undecided = [i for i, o in enumerate(outcomes) if o == "inconclusive"]
        if "kept" in outcomes or not undecided or undecided[0] >= top:
            break
        top = undecided[0]
        lo, hi = 0, top - 1
    _note_undecided(rungs, plan, log)


def _note_undecided(rungs: list[Candidate], plan: _Plan, log: SearchLog) -> None:
    """Say, for each inconclusive form of a family's rungs, what the search did about it."""
    forms = [(i, c) for i, rung in enumerate(rungs) for c in (rung, rung.fallback) if c is not None]
    tried = [(i, log.tried[c.variant.name]) for i, c in forms if c.variant.name in log.tried]
    kept = [(i, t.name) for i, t in tried if t.outcome == "kept"]
    cap = plan.recipe.eval.max_episodes
    for at, t in tried:
        if t.outcome != "inconclusive":
            continue
        episodes = max(o.episodes for o in t.per_seed.values())
        more = (f"undecided after {episodes:,} episodes" +
                (" (the cap, eval.max_episodes: raise it and rerun to decide it)" if cap and episodes >= cap else ""))
        same = [n for i, n in kept if i == at]
        smaller = [n for i, n in kept if i > at]
        if same:
            then = f"its other form {same[0]} kept the return"
        elif smaller:
            then = f"the smaller {smaller[-1]} kept the return"
        elif kept:
            then = f"no smaller rung kept the return; the larger {kept[-1][1]} did"
        else:
            then = "no rung of its family kept the return"
        log.record(t.model_copy(update={"note": f"{more}; passed over: the search went on to smaller rungs, "
                                                f"and {then}"}))


class SearchClock:
    """Where a search's time goes, and its estimate: after the first rung is played, the rungs a
    bisection of every ladder plays (ceil(log2(rungs + 1)) a family) times that rung's seconds (its
    candidates' builds and its looks), on top of the time already spent."""

    def __init__(self, rungs: dict[str, list[Candidate]], log: Callable[[str], None], started: float) -> None:
        self.started, self.log = started, log
        self.expected = sum(math.ceil(math.log2(len(family) + 1)) for family in rungs.values())
        second_forms = sum(1 for family in rungs.values() for c in family if c.fallback is not None)
        self.most = sum(len(family) for family in rungs.values()) + second_forms
        self.baseline_seconds: float | None = None
        self.estimate: float | None = None
        counts = sorted({c.variant.candidates.count for f in rungs.values() for c in f if c.variant.candidates})
        builds = f", each student the best of {'/'.join(map(str, counts))} builds" if counts else ""
        forms = f", a rung not kept builds its second form (up to {second_forms})" if second_forms else ""
        log(f"[search] {self.most - second_forms} rungs in {len(rungs)} families{builds}{forms}: bisection plays about "
            f"{self.expected} (all {self.most} at most); the time estimate follows the first one")

    def baselines_done(self) -> None:
        self.baseline_seconds = round(time.monotonic() - self.started, 1)

    def played(self, tried: Tried) -> None:
        if self.estimate is not None or not tried.per_seed or tried.seconds is None:
            return
        elapsed = time.monotonic() - self.started
        self.estimate = round(elapsed + max(self.expected - 1, 0) * tried.seconds, 1)
        build = sum(o.build_seconds or 0.0 for o in tried.per_seed.values())
        play = sum(o.play_seconds or 0.0 for o in tried.per_seed.values())
        self.log(f"[search] estimate: ~{_minutes(self.estimate)} in all, before the seeds' runs are finished "
                 f"({_minutes(elapsed)} so far; {tried.name} took {tried.seconds:.0f} s: build {build:.0f} s, "
                 f"play {play:.0f} s; ~{self.expected} rungs by bisection, up to {self.most} if rungs stay "
                 f"undecided: ~{_minutes(elapsed + max(self.most - 1, 0) * tried.seconds)})")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def pareto_names(tried: dict[str, Tried], seeds: int) -> list[str]:
    """Kept candidates (within tolerance on every seed) that no other kept one beats on both objective
    and mean normalized score: a lost candidate's higher point estimate is not a trade-off to offer."""

    full = [t for t in tried.values() if len(t.per_seed) == seeds and t.outcome == "kept"]
    scores = [statistics.fmean((o.normalized_score or 0.0) for o in t.per_seed.values()) for t in full]
    return [full[i].name for i in pareto_front([t.objective for t in full], scores)]


def _budget(search: SearchConfig, log: SearchLog, started: float) -> Callable[[], str | None]:
    def spent() -> str | None:
        played = sum(1 for t in log.tried.values() if t.per_seed)
        if search.max_candidates is not None and played >= search.max_candidates:
            return f"{search.max_candidates} candidates played"
        if search.max_seconds is not None and time.monotonic() - started > search.max_seconds:
            return f"{search.max_seconds:g} s"
        return None
    return spent


def summary(recipe: Recipe, log: SearchLog, seconds: float, clock: SearchClock | None = None) -> SearchSummary:
    """results.json's search object: the winner, the front, every candidate and why it was dropped."""
    best = _best(log.tried)
    played = [t for t in log.tried.values() if t.per_seed]
    outcomes = [o for t in played for o in t.per_seed.values()]
    return SearchSummary(
        objective=recipe.search.objective,
        tolerance=recipe.eval.tolerance,
        winner=best and best.name,
        winner_objective=best and best.objective,
        front=pareto_names(log.tried, len(recipe.seeds or [recipe.seed])),
        tried=list(log.tried.values()),
        cost=SearchCost(wall_seconds=round(seconds, 1), candidates_played=len(played),
                        units=sum(len(t.per_seed) for t in played),
                        estimated_seconds=clock and clock.estimate, baseline_seconds=clock and clock.baseline_seconds,
                        build_seconds=round(sum(o.build_seconds or 0.0 for o in outcomes), 1),
                        play_seconds=round(sum(o.play_seconds or 0.0 for o in outcomes), 1)),
    )


def _check_names(recipe: Recipe) -> None:
    """A candidate and a listed variant of one name must be one policy: both are built as variants
    of each seed's run, and a stage holds one build per name."""
    listed = {v.name: v for v in recipe.variants}
    clash = [v.name for v in candidate_variants(recipe.search) if v.name in listed and listed[v.name] != v]
    if clash:
        raise UserError(f"variants: {', '.join(clash)} also name(s) a search candidate defined otherwise; "
                        "rename the listed variant or define it as the search does")


def run_search(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Train each seed's baseline, search the recipe's families for the smallest policy that keeps
    the return on every seed, then finish each seed's run (its listed variants and every candidate
    it played) and aggregate."""
    started = time.monotonic()
    _check_names(recipe)
    opened = open_seeds(recipe, run_dir, quiet)
    workers, run_dir = opened.workers, opened.layout.root
    rungs = ladders(recipe, opened.info.obs_shape, opened.info.n_actions)
    forms = [f.variant for family in rungs.values() for c in family for f in (c, c.fallback) if f]
    search_log = SearchLog(opened.layout.search_log)
    unplayed = [v for v in forms if v.name not in search_log.tried]  # a resumed search needs no pool for the rest
    with search_build_pool(recipe, len(opened.seeds), recipe.workers or cpu_count(), unplayed) as pool:
        plan = _Plan([(one.seed, one.recipe, str(one.layout.root)) for one in opened.seeds], recipe, workers,
                     opened.quiet, log, pool)
        log(f"[search] training {len(plan.seeds)} baseline(s) on {recipe.executor}, {workers} at a time")
        clock = SearchClock(rungs, log, started)
        map_units(baseline_unit, [(one, d, plan.quiet) for _, one, d in plan.seeds], recipe.executor, workers,
                  recipe.address)
        clock.baselines_done()

        for family in rungs.values():
            bisect_family(family, plan, search_log, _budget(recipe.search, search_log, started), clock)
    found = summary(recipe, search_log, time.monotonic() - started, clock)
    log(f"[search] winner: {found.winner or 'none within tolerance on every seed'}")

    by_name = {v.name: v for v in forms}
    units = []
    listed = {v.name for v in recipe.variants}  # a candidate listed as a variant too is built once
    for seed, one, seed_dir in plan.seeds:
        played = [by_name[t.name] for t in search_log.tried.values() if str(seed) in t.per_seed and t.name not in listed]
        one = one.model_copy(update={"variants": [*one.variants, *played]})
        units.append((one, seed_dir, plan.quiet, SearchMark(winner=found.winner, objective=recipe.search.objective)))
    finishing = time.monotonic()
    runs = map_units(finish_unit, units, recipe.executor, workers, recipe.address)
    search = found.model_copy(update={"cost": found.cost.model_copy(
        update={"wall_seconds": round(time.monotonic() - started, 1),
                "finish_seconds": round(time.monotonic() - finishing, 1)})})
    log(f"[search] {_cost_line(search.cost)}")
    results = write_seeds_results(recipe, run_dir, runs, workers, opened.threads, search)
    return RunOutcome(run_dir=run_dir, results=results, resumed=opened.resumed)


def _cost_line(cost: SearchCost) -> str:
    """'done in 5.2 min (estimated 4.8 min): baselines 40 s, builds 150 s, plays 90 s, finishing 30 s'."""
    estimated = f" (estimated {_minutes(cost.estimated_seconds)})" if cost.estimated_seconds is not None else ""
    return (f"done in {_minutes(cost.wall_seconds)}{estimated}: " + ", ".join(time_parts(cost))
            + " (builds and plays summed over seeds)")


class SearchFingerprint(NamedTuple):
    """What a search computed, timings left out (search_fingerprint)."""

    winner: str | None
    front: list[str]
    tried: list[dict[str, JsonValue]]
    seeds: dict[str, dict[str, PolicyFingerprint]]


def search_fingerprint(run_dir: Path) -> SearchFingerprint:
    """What a search computed, timings left out: its winner, front, every candidate's outcome and
    per-seed verdicts, and each seed's run fingerprint. Equal for two searches that computed the
    same thing, whichever engine ran them and however often they were killed and resumed."""
    layout = RunLayout(Path(run_dir))
    results = load_results(layout.results)
    if not isinstance(results, SeedsResults) or results.search is None:
        raise UserError(f"{run_dir}: not a search's run directory (its results.json has no search)")
    found = results.search
    return SearchFingerprint(
        found.winner, found.front,
        [t.model_dump(mode="json", include={"name", "outcome", "per_seed", "objective"},
                      exclude={"per_seed": {"__all__": {"build_seconds", "play_seconds"}}}) for t in found.tried],
        {str(seed): run_fingerprint(layout.seed(seed).root) for seed in results.seeds},
    )
