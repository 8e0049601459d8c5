"""Sequential looks: play more paired episodes while a verdict is open, each look a resumable stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress_dqn.evaluation.play import play_unit
from compress_dqn.evaluation.verdicts import Verdict, paired_difference, sequential_plan
from compress_dqn.run.context import RunContext
from compress_dqn.run.executors import map_units, worker_count
from compress_dqn.store import stage_keys as keys


def _play(ctx: RunContext, wanted: dict[str, tuple[str | None, int, int]], workers: int = 1) -> dict[str, list[float]]:
    """Each wanted key's returns: (TFLite policy name or None for random, first episode, end episode),
    episode i on seed eval.seed + i. `workers` play at once, each range cut in chunks so that
    the workers finish together; the longest chunks start first."""

    env_data = ctx.recipe.env.model_dump(mode="json")
    pieces = worker_count(sum(after - before for _, before, after in wanted.values()), workers)
    chunks = []  # (key, first episode, episodes, what the unit plays)
    for key, (name, before, after) in wanted.items():
        tflite = None if name is None else str(ctx.folder(name) / "policy.tflite")
        size = -(-(after - before) // pieces)
        for first in range(before, after, size):
            count = min(size, after - first)
            chunks.append((key, first, count, (env_data, tflite, ctx.info.n_actions, ctx.recipe.eval.seed + first, count)))
    chunks.sort(key=lambda chunk: -chunk[2])
    results = map_units(play_unit, [chunk[3] for chunk in chunks], ctx.recipe.executor,
                        worker_count(len(chunks), workers), ctx.recipe.address)
    played: dict[str, list[float]] = {key: [] for key in wanted}
    for (key, *_), returns in sorted(zip(chunks, results), key=lambda pair: pair[0][1]):  # in episode order
        played[key] += returns
    return played


def _play_look(ctx: RunContext, before: int, after: int, names: list[str], workers: int = 1) -> None:
    """Record episodes before..after of the reference (stage "reference:AFTER": the baseline and the
    random policy) and of each named variant (stages "look:AFTER:NAME"), played `workers` at once."""
    reference_due = keys.reference(after) not in ctx.stages.done
    due = [name for name in names if keys.look(after, name) not in ctx.stages.done]
    wanted: dict[str, tuple[str | None, int, int]] = {name: (name, before, after) for name in due}
    if reference_due:
        wanted |= {"baseline": ("baseline", before, after), "random": (None, before, after)}
    if not wanted:
        return
    played = _play(ctx, wanted, workers)
    if reference_due:
        ctx.stages.finish(keys.reference(after), {"baseline": played["baseline"], "random": played["random"]})
    for name in due:
        ctx.stages.finish(keys.look(after, name), {"episodes": played[name]})


def reference_episodes(ctx: RunContext, upto: int) -> dict[str, list[float]]:
    """The baseline's and the random policy's first `upto` episode returns (a look count), played
    once per look (stage "reference:N") and shared by every variant paired with them."""

    cfg, done = ctx.recipe.eval, ctx.stages.done
    episodes = {"baseline": list(done["evaluate"]["return"]["episodes"]),
                "random": list(done["random"]["return"]["episodes"])}
    plan, _ = sequential_plan(cfg.episodes, cfg.max_episodes)
    for before, after in zip(plan, plan[1:]):
        if after > upto:
            break
        _play_look(ctx, before, after, [])
        episodes["baseline"] += done[keys.reference(after)]["baseline"]
        episodes["random"] += done[keys.reference(after)]["random"]
    return episodes


def decide(ctx: RunContext, names: list[str] | None = None, workers: int = 1) -> dict[str, list[float]]:
    """Sequential evaluation of the named variants (default: all): at each look (episodes,
    doubling, up to eval.max_episodes) those whose verdict is still inconclusive play the next
    episodes, paired with the baseline's and the random policy's same episodes; a look's episodes
    of every open variant and of the reference are played `workers` at once. Each look is a stage
    ("look:N:NAME"), so a killed run resumes at the look it was in.

    Returns every named variant's episode returns, and the baseline's and the random policy's
    over as many episodes as the longest of them ("baseline", "random", names)."""

    cfg, done = ctx.recipe.eval, ctx.stages.done
    names = [v.name for v in ctx.recipe.variants] if names is None else names
    played = {name: list(done[keys.variant(name)]["return"]["episodes"]) for name in names}
    plan, confidence = sequential_plan(cfg.episodes, cfg.max_episodes)
    still_open = list(names)
    for before, after in zip(plan, plan[1:]):
        reference = reference_episodes(ctx, before)
        verdicts = {name: paired_difference(played[name], reference["baseline"], cfg.tolerance, reference["random"],
                                            confidence).verdict for name in still_open}
        still_open = [name for name in still_open if verdicts[name] is Verdict.INCONCLUSIVE]
        if not still_open:
            break
        for name in still_open:
            if keys.look(after, name) not in done:
                ctx.log(f"[{name}] inconclusive after {before} episodes: playing to {after}")
        _play_look(ctx, before, after, still_open, workers)
        for name in still_open:
            played[name] += done[keys.look(after, name)]["episodes"]
    longest = max([len(e) for e in played.values()], default=cfg.episodes)
    return {**reference_episodes(ctx, longest), **played}
