"""A search's section of the report: its winner, its front, every candidate with its outcome and time."""

from __future__ import annotations

from compress_dqn.evaluation.columns import at_one_short, at_one_state, percent
from compress_dqn.evaluation.figures import ONE_PERCENT
from compress_dqn.evaluation.results import SearchCost, SearchSummary, SeedOutcome, Tried

__all__ = ["render_search_markdown", "time_parts"]


def render_search_markdown(search: SearchSummary) -> list[str]:
    """The search section: winner, front, every candidate with why it was kept or dropped, cost."""
    unit = {"gzip_bytes": "gzipped bytes", "params": "nonzero parameters", "latency": "TFLite p50 us"}[search.objective]
    cost = search.cost
    wide = search.tolerance > ONE_PERCENT
    winner = (f"**{search.winner}** ({search.winner_objective:,.0f} {unit}, median over seeds)"
              if search.winner else "**none** kept the return on every seed")
    if wide and search.winner:
        winner += _winner_at_one(search)
    within = f"within {percent(search.tolerance)} of the baseline's lead" if wide else "within tolerance"
    lines = [
        f"## Search: the smallest policy {within} on every seed",
        "",
        f"- Winner: {winner}.",
        f"- Front (objective vs mean normalized score, among the kept candidates): {', '.join(search.front) or 'none'}.",
        f"- Cost: {cost.wall_seconds:,.0f} s wall{_cost_parts(cost)}, {cost.candidates_played} candidates played, "
        f"{cost.units} (seed, candidate) units.",
        "",
        "| candidate | family | estimated weight bytes | outcome | objective (median) | per-seed verdicts (episodes) "
        "| build s / play s |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in search.tried:
        verdicts = ", ".join(f"{seed}: {_seed_verdict(o)}" for seed, o in t.per_seed.items()) or "-"
        objective = f"{t.objective:,.0f}" if t.objective is not None else "-"
        outcome = f"{t.outcome}: {t.note}" if t.note else t.outcome
        lines.append(f"| {t.name} | {t.family} | {t.estimated_bytes:,.0f} | {outcome} | {objective} | {verdicts} "
                     f"| {_rung_seconds(t)} |")
    lines += ["", "Each ladder is bisected for its smallest rung that keeps the return (a candidate is dropped at its "
              "first losing seed; a rung whose weights alone outweigh the best kept policy is skipped unplayed). "
              "A rung left inconclusive at the episode cap does not stop its family: the smaller rungs are built "
              "and played, and the larger ones only where none of them keeps the return."]
    return lines


def time_parts(cost: SearchCost) -> list[str]:
    """['baselines 40 s', 'builds 150 s', 'plays 90 s', 'finishing 30 s'], for what was recorded
    (the report's cost line and the search's last log line)."""
    return [f"{name} {seconds:,.0f} s" for name, seconds in (
        ("baselines", cost.baseline_seconds), ("builds", cost.build_seconds), ("plays", cost.play_seconds),
        ("finishing", cost.finish_seconds)) if seconds is not None]


def _cost_parts(cost: SearchCost) -> str:
    """' (estimated 300 s; baselines 40 s, builds 150 s, plays 90 s, finishing 30 s)', for what was recorded."""
    estimated = [f"estimated {cost.estimated_seconds:,.0f} s"] if cost.estimated_seconds is not None else []
    inner = "; ".join(x for x in (", ".join(estimated), ", ".join(time_parts(cost))) if x)
    return f" ({inner})" if inner else ""


def _rung_seconds(tried: Tried) -> str:
    """'95 / 40' (summed over the seeds it played), or '-' where not recorded."""
    build = [o.build_seconds for o in tried.per_seed.values() if o.build_seconds is not None]
    play = [o.play_seconds for o in tried.per_seed.values() if o.play_seconds is not None]
    return f"{sum(build):,.0f} / {sum(play):,.0f}" if build or play else "-"


def _winner_at_one(search: SearchSummary) -> str:
    """'; at 1%: seed 0 within 1% (12,800 episodes), seed 1 inconclusive (~40,000 episodes would decide it)'."""
    winner = next((t for t in search.tried if t.name == search.winner), None)
    states = [f"seed {seed} {at_one_state(o.at_one_percent, o.episodes)}"
              for seed, o in (winner.per_seed.items() if winner else []) if o.at_one_percent is not None]
    return f"; at 1%: {', '.join(states)}" if states else ""


def _seed_verdict(outcome: SeedOutcome) -> str:
    """'within 1% (400)'; an open verdict also says about how many episodes would decide it, and beside a
    tolerance wider than 1%, the verdict at 1% ('within 5% (400; at 1%: inconclusive, ~4,000 to decide)')."""
    text = f"{outcome.verdict} ({outcome.episodes:,}"
    if outcome.episodes_to_decide:
        text += f"; ~{outcome.episodes_to_decide:,} to decide"
    if outcome.at_one_percent is not None:
        text += f"; at 1%: {at_one_short(outcome.at_one_percent)}"
    return text + ")"
