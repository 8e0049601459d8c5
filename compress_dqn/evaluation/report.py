"""Turn results.json into results.csv, report.md, a self-contained report.html and PNG plots.

The headline a reader needs first: which variant is smallest (or fastest) while keeping the
baseline's return, and by how much. Pure data in, files out; no TensorFlow.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compress_dqn.deploy.micro import TFLM_RUNTIME_FLASH
from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import RunResults, SeedsResults, load_results
from compress_dqn.evaluation.verdicts import Verdict, episodes_to_decide, keeps_return
from compress_dqn.fileio import write_bytes_atomic, write_text_atomic


def pareto_front(costs: Sequence[float], returns: Sequence[float]) -> list[int]:
    """Indices of points no other point beats on both cost (lower) and return (higher)."""
    front = []
    for i, (cost, ret) in enumerate(zip(costs, returns)):
        dominated = any(
            (c <= cost and r >= ret) and (c < cost or r > ret) for j, (c, r) in enumerate(zip(costs, returns)) if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: costs[i])


def _get(entry: dict | None, *path: str) -> Any:
    for key in path:
        if not isinstance(entry, dict) or entry.get(key) is None:
            return None
        entry = entry[key]
    return entry


def rows(results: RunResults) -> list[dict[str, Any]]:
    """One flat row per variant (the CSV, and the tables)."""
    out = []
    for v in results.variants:
        versus = v.return_vs_baseline
        out.append({
            "name": v.name,
            "return_mean": v.returns["mean"],
            "return_std": v.returns["std"],
            "return_ci_low": v.returns["ci95"][0],
            "return_ci_high": v.returns["ci95"][1],
            "diff_mean": _get(versus, "mean") if versus else 0.0,
            "diff_ci_low": (_get(versus, "ci") or [0.0, 0.0])[0],
            "diff_ci_high": (_get(versus, "ci") or [0.0, 0.0])[1],
            "normalized_score": _get(versus, "normalized_score") if versus else _baseline_normalized(results),
            "margin": _get(versus, "margin"),
            "baseline_same_episodes": v.returns["mean"] - versus["mean"] if versus else None,
            "episodes": v.episodes,
            "episodes_differing": _get(versus, "episodes_differing"),
            "verdict": v.verdict,
            "episodes_to_decide": _to_decide(versus),
            "action_agreement": v.action_agreement,
            "action_agreement_decisive": v.action_agreement_decisive,
            "params": v.size["params"],
            "nonzero_params": v.size["nonzero_params"],
            "tflite_bytes": v.size["tflite_bytes"],
            "tflite_gzip_bytes": v.size["tflite_gzip_bytes"],
            "saved_model_bytes": v.size["saved_model_bytes"],
            "tflite_p50_us": _get(v.latency_us, "cpu", "tflite", "p50"),
            "tflite_p99_us": _get(v.latency_us, "cpu", "tflite", "p99"),
            "saved_model_p50_us": _get(v.latency_us, "cpu", "saved_model", "p50"),
            "tflite_peak_rss": _get(v.memory_bytes, "cpu_rss", "tflite", "peak_rss"),
            "saved_model_peak_rss": _get(v.memory_bytes, "cpu_rss", "saved_model", "peak_rss"),
            "micro_flash_bytes": _get(v.micro, "flash_bytes") if _get(v.micro, "runs") else None,
            "micro_arena_bytes": _get(v.micro, "arena_bytes_with_margin"),
        })
    return out


def _baseline_normalized(results: RunResults) -> float | None:
    """1.0, the baseline's own normalized score, unless it does not beat the random policy (no scale)."""
    return 1.0 if _lead_over_random(results) > 0 else None


def _lead_over_random(results: RunResults) -> float:
    return results.baseline.returns["mean"] - results.random["return"]["mean"]


def _to_decide(versus: dict | None) -> int | None:
    """The episode estimate of an inconclusive verdict, recomputed from its CI (an estimate stored by
    an older version of the rule would otherwise be re-rendered as it was)."""

    if not versus or Verdict.of(versus.get("verdict")) is not Verdict.INCONCLUSIVE:
        return None
    lo, hi = versus["ci"]
    return episodes_to_decide(versus["episodes"], lo, hi, versus["mean"], versus["margin"])


def _times(ratio: float) -> str:
    """'60x smaller', '1.3x smaller', '1.2x larger': a ratio below 10 keeps a decimal, below 1 turns around."""
    if ratio < 1:
        return f"{1 / ratio:.1f}x larger"
    return f"{ratio:.0f}x smaller" if ratio >= 10 else f"{ratio:.1f}x smaller"


NO_VARIANTS = "No variants: the recipe lists none, so this run trained and evaluated the baseline only."


def _keeper_lines(base: dict[str, Any], keepers: list[dict[str, Any]]) -> list[str]:
    """The smallest and the fastest of the policies that keep the return, against the baseline."""
    lines = []
    small = min(keepers, key=lambda r: r["tflite_gzip_bytes"])
    lines.append(
        f"Smallest policy that keeps the baseline's return: {small['name']}, "
        f"{small['tflite_gzip_bytes']:,} bytes gzipped, {_times(base['tflite_gzip_bytes'] / small['tflite_gzip_bytes'])} "
        f"than the fp32 baseline's {base['tflite_gzip_bytes']:,} gzipped bytes "
        f"({_times(base['tflite_bytes'] / small['tflite_bytes'])} raw to raw), return {small['return_mean']:.1f} "
        f"vs the baseline's {small['baseline_same_episodes']:.1f} on the same {small['episodes']} episodes "
        f"({small['verdict']})."
    )
    timed = [r for r in keepers if r["tflite_p50_us"] is not None]
    if timed and base["tflite_p50_us"] is not None:
        fast = min(timed, key=lambda r: r["tflite_p50_us"])
        if fast["tflite_p50_us"] < base["tflite_p50_us"]:
            lines.append(
                f"Fastest: {fast['name']}, {fast['tflite_p50_us']:.1f} us per action (TFLite, batch 1, p50) vs "
                f"{base['tflite_p50_us']:.1f} us for the fp32 TFLite baseline and "
                f"{base['saved_model_p50_us']:.0f} us through TensorFlow."
            )
        else:
            lines.append(
                f"None of the policies that keep the return is faster than the fp32 TFLite baseline "
                f"({base['tflite_p50_us']:.1f} us per action, batch 1, p50; the quickest of them, {fast['name']}, "
                f"{fast['tflite_p50_us']:.1f} us)."
            )
    return lines


def headline(results: RunResults) -> list[str]:
    """The findings a reader should see first, as sentences."""
    table = rows(results)
    base = table[0]
    keepers = [r for r in table[1:] if keeps_return(r["verdict"])]
    lines = []
    if len(table) > 1 and _lead_over_random(results) <= 0:
        lines.append(
            f"Warning: the baseline ({base['return_mean']:.1f}) does not beat a uniform-random policy "
            f"({results.random['return']['mean']:.1f}), so the tolerance has no scale (a margin of 0) and no "
            "verdict says the compression kept anything worth keeping; train a stronger baseline first."
        )
    lines.append(
        f"Baseline return {base['return_mean']:.1f} over {base['episodes']} episodes; a uniform-random policy gets "
        f"{results.random['return']['mean']:.1f} on the same episodes (the 0% of normalized scores)."
    )
    if keepers:
        lines += _keeper_lines(base, keepers)
    else:
        lines.append(NO_VARIANTS if len(table) == 1 else "No variant kept the baseline's return (see the verdicts below).")
    losses = [r["name"] for r in table[1:] if Verdict.of(r["verdict"]) is Verdict.WORSE]
    if losses:
        lines.append(f"Worse than the tolerance: {', '.join(losses)}.")
    undecided = [r for r in table[1:] if Verdict.of(r["verdict"]) is Verdict.INCONCLUSIVE]
    if undecided:
        names = [r["name"] + (f" (~{r['episodes_to_decide']:,} would decide it)" if r["episodes_to_decide"] else "")
                 for r in undecided]
        estimated = any(r["episodes_to_decide"] for r in undecided)
        why = " (paired episodes, if the mean difference and its spread hold)" if estimated else ""
        lines.append(f"Not decided within {results.eval['max_episodes']} episodes: {', '.join(names)}{why}. To decide "
                     "them, raise eval.max_episodes (compress and search: --max-episodes) and rerun on the same "
                     "directory: the episodes already played are kept.")
    on_micro = [r for r in keepers if r["micro_arena_bytes"] is not None]

    runtime = TFLM_RUNTIME_FLASH["high_bytes"]  # TFLM's own code in flash, the high end of its docs' estimate
    for budget in (32 * 1024, 256 * 1024):
        fits = [r for r in on_micro if r["micro_arena_bytes"] <= budget and r["micro_flash_bytes"] + runtime <= budget]
        if fits:
            best = min(fits, key=lambda r: r["micro_arena_bytes"] + r["micro_flash_bytes"])
            lines.append(
                f"Fits a microcontroller with {budget // 1024} KB of RAM and {budget // 1024} KB of flash: {len(fits)} "
                f"{'policy that keeps' if len(fits) == 1 else 'policies that keep'} the return, smallest {best['name']} "
                f"(RAM: {best['micro_arena_bytes']:,} B tensor arena with margin; flash: {best['micro_flash_bytes']:,} B "
                f"model + ~{runtime // 1024} KB TFLite Micro runtime, its docs' estimate)."
            )
            break
    if results.search and results.search.get("winner"):
        lines.append(f"Search winner (smallest by {results.search['objective']} within tolerance on every training "
                     f"seed): {results.search['winner']}.")
    if base["tflite_peak_rss"] and base["saved_model_peak_rss"]:
        lines.append(
            f"Serving memory: a TFLite policy process peaks at {base['tflite_peak_rss'] / 2**20:.0f} MiB; "
            f"the same policy through TensorFlow at {base['saved_model_peak_rss'] / 2**20:.0f} MiB."
            + (" TensorFlow's figure is probed for the baseline only (measure.saved_model_memory: baseline)."
               if any(r["tflite_peak_rss"] and not r["saved_model_peak_rss"] for r in table[1:]) else "")
        )
    return lines


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

_VERDICT_COLORS = {Verdict.REFERENCE: "#333333", Verdict.BETTER: "#1a9850", Verdict.WITHIN: "#4575b4",
                   Verdict.INCONCLUSIVE: "#fdae61", Verdict.WORSE: "#d73027"}


def _color(verdict: str | None) -> str:
    """Verdict colour; every "within N%" shares one."""
    return _VERDICT_COLORS.get(Verdict.of(verdict), "#999999")


def _figure_bytes(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def plot_return_vs(results: RunResults, cost_key: str, what: str, unit: str, title: str, scale: float = 1.0) -> bytes | None:
    """Return (with 95% CI) against a cost (divided by scale), on a log axis where the costs span more
    than 20x (a linear one otherwise: log ticks over 48-51 MiB read as 4.8x10^7); Pareto front
    highlighted; points labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = [r for r in rows(results) if r[cost_key]]
    if not table:
        return None
    costs = [r[cost_key] / scale for r in table]
    means = [r["return_mean"] for r in table]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    # The front is drawn over the baseline and the variants that keep its return: a worse or undecided
    # variant's point estimate is not a trade-off the report offers.
    eligible = [i for i, r in enumerate(table) if Verdict.of(r["verdict"]) is Verdict.REFERENCE or keeps_return(r["verdict"])]
    front = [eligible[j] for j in pareto_front([costs[i] for i in eligible], [means[i] for i in eligible])]
    ax.plot([costs[i] for i in front], [means[i] for i in front], "-", color="#bbbbbb", lw=6, alpha=0.6, zorder=1)
    ax.plot([costs[i] for i in front], [means[i] for i in front], "o", ms=16, mfc="none", mec="#888888", mew=2,
            zorder=2, label="Pareto front (policies that keep the return)")
    # Stagger labels left to right so points at the same return (CartPole's 500s) stay readable.
    order = sorted(range(len(table)), key=lambda i: costs[i])
    offsets = [(6, 8), (6, -14), (6, 20), (6, -26)]
    for rank, i in enumerate(order):
        r, cost, mean = table[i], costs[i], means[i]
        color = _color(r["verdict"])
        ax.errorbar(cost, mean, yerr=[[mean - r["return_ci_low"]], [r["return_ci_high"] - mean]], fmt="o",
                    color=color, ms=8 if r["name"] == "baseline" else 6, capsize=3, zorder=3)
        ax.annotate(r["name"], (cost, mean), textcoords="offset points", xytext=offsets[rank % len(offsets)],
                    fontsize=8, arrowprops={"arrowstyle": "-", "color": "#cccccc", "lw": 0.6})
    base = next((r for r in table if r["name"] == "baseline"), None)
    if base is not None:
        ax.axhline(base["return_mean"], ls="--", lw=0.8, color="#333333", zorder=0, label="baseline return")
    for verdict in dict.fromkeys(r["verdict"] for r in table):
        if verdict:
            ax.plot([], [], "o", color=_color(verdict), label=verdict)
    wide = max(costs) > 20 * min(costs)
    if wide:
        ax.set_xscale("log")
    ax.set_xlabel(f"{what} ({unit}{', log' if wide else ''})")
    ax.set_ylabel(f"mean return over {results.eval['episodes']}+ episodes (95% CI)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
    data = _figure_bytes(fig)
    plt.close(fig)
    return data


def plot_bars(results: RunResults, keys: Sequence[tuple[str, str]], xlabel: str, title: str, scale: float = 1.0) -> bytes | None:
    """Horizontal bars per variant for one or two runtimes (log axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = rows(results)
    if not any(r[key] for r in table for key, _ in keys):
        return None
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(table) + 1.2))
    height = 0.8 / len(keys)
    for k, (key, label) in enumerate(keys):
        values = [(r[key] or 0) / scale for r in table]
        positions = [i + k * height for i in range(len(table))]
        ax.barh(positions, values, height=height, label=label)
        for y, value in zip(positions, values):
            if value:
                ax.text(value, y, f" {value:.3g}", va="center", fontsize=7)
    ax.set_yticks([i + height * (len(keys) - 1) / 2 for i in range(len(table))])
    ax.set_yticklabels([r["name"] for r in table], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    for k, (key, _) in enumerate(keys):  # a runtime measured for some policies only: say so, not a blank
        if any(r[key] for r in table):
            for i, r in enumerate(table):
                if r[key] is None:
                    ax.text(ax.get_xlim()[0], i + k * height, " not probed", va="center", fontsize=7, color="#777777")
    ax.set_xlabel(xlabel)
    ax.set_title(title, pad=24)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(keys), frameon=False)
    ax.grid(True, axis="x", which="both", alpha=0.25)
    data = _figure_bytes(fig)
    plt.close(fig)
    return data


def make_plots(results: RunResults) -> dict[str, bytes]:
    """PNG bytes by file name."""
    plots = {
        "return_vs_size.png": plot_return_vs(results, "tflite_gzip_bytes", "TFLite file size, gzipped", "bytes",
                                             f"{results.env_id}: return vs policy size"),
        "return_vs_latency.png": plot_return_vs(results, "tflite_p50_us", "TFLite action latency p50", "us",
                                                f"{results.env_id}: return vs latency"),
        "return_vs_memory.png": plot_return_vs(results, "tflite_peak_rss", "TFLite process peak RSS", "MiB",
                                               f"{results.env_id}: return vs inference memory", scale=2**20),
        "latency.png": plot_bars(results, [("tflite_p50_us", "TFLite (LiteRT)"), ("saved_model_p50_us", "SavedModel (TensorFlow)")],
                                 "batch-1 action latency p50 (us, log)", "Latency per variant"),
        "memory.png": plot_bars(results, [("tflite_peak_rss", "TFLite process"), ("saved_model_peak_rss", "TensorFlow process")],
                                "peak RSS (MiB, log)", "Inference memory per variant", scale=2**20),
    }
    return {name: data for name, data in plots.items() if data is not None}


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------

_COLUMNS = [
    ("variant", "name", "{}"), ("return", "return_mean", "{:.1f}"), ("vs baseline", "diff_mean", "{:+.1f}"),
    ("CI of difference", None, None), ("verdict", "verdict", "{}"), ("episodes (differed)", "episodes", "{}"),
    ("normalized", "normalized_score", "{:.1%}"), ("agreement", "action_agreement", "{:.3f}"),
    ("decisive", "action_agreement_decisive", "{:.3f}"),
    ("nonzero / params", None, None), ("TFLite bytes", "tflite_bytes", "{:,}"), ("gzipped", "tflite_gzip_bytes", "{:,}"),
    ("TFLite p50 us", "tflite_p50_us", "{:.1f}"), ("TF p50 us", "saved_model_p50_us", "{:.0f}"),
    ("TFLite RSS MiB", "tflite_peak_rss", "mib"), ("TF RSS MiB", "saved_model_peak_rss", "mib"),
    ("MCU arena B", "micro_arena_bytes", "{:,}"),
]


def _cells(r: dict) -> list[str]:
    cells = []
    for _, key, fmt in _COLUMNS:
        if key is None and fmt is None:
            cells.append(_ci_cell(r) if len(cells) == 3 else f"{r['nonzero_params']:,} / {r['params']:,}")
            continue
        if key == "episodes" and r["episodes_differing"] is not None:
            cells.append(f"{r['episodes']} ({r['episodes_differing']})")
            continue
        value = r[key]
        if value is None:
            cells.append("-")
        elif fmt == "mib":
            cells.append(f"{value / 2**20:.0f}")
        else:
            cells.append(fmt.format(value))
    return cells


def _ci_cell(r: dict) -> str:
    """The difference's CI with as many decimals (1-3) as it takes to tell its ends from -margin."""
    lo, hi, margin = r["diff_ci_low"], r["diff_ci_high"], r["margin"]
    digits = 1
    while margin and digits < 3 and any(round(end, digits) == round(-margin, digits) for end in (lo, hi)):
        digits += 1
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def _notes(results: RunResults) -> list[str]:
    ev = results.eval
    random = results.random["return"]["mean"]
    base = results.baseline.returns["mean"]
    looks = ev["looks"]
    sequential = (
        f" While a verdict was inconclusive, that variant (with the baseline and the random policy) played more "
        f"episodes, at looks {', '.join(map(str, looks))}; each CI is at {ev['confidence']:.2%} so the {len(looks)} "
        "looks keep each verdict's error rate at 5% (per variant: across many variants, the chance that one "
        "of them is wrong is higher)." if len(looks) > 1 else ""
    )
    margins = sorted(m for r in rows(results)[1:] if (m := r["margin"]) is not None)
    margin_text = ("" if not margins else f", a margin of -{margins[0]:.2f}" + (
        f" to -{margins[-1]:.2f} (each on the variant's own episodes)" if margins[-1] - margins[0] >= 0.005 else ""))
    notes = [
        f"Every variant plays the baseline's episode seeds (from {ev['seed']}), so differences are paired. The verdict "
        f"is a non-inferiority test: 'within {100 * ev['tolerance']:g}%' means the {ev['confidence']:.2%} bootstrap CI "
        f"of the per-episode difference stays above -{100 * ev['tolerance']:g}% of the baseline's lead over a "
        f"uniform-random policy ({base:.1f} vs {random:.1f} on the same episodes){margin_text}; 'better' means it is "
        f"above 0, 'worse' below the margin, 'inconclusive' neither. The CI's lower end counts one more episode that "
        "loses the baseline's whole lead (or the largest loss seen) times the share of episodes whose returns were "
        "identical: a bootstrap cannot see a rare failure it has not sampled, so identical episodes decide 'within' "
        "only once there are enough of them to make such a failure rare (~400 at 1%). 'Episodes (differed)': how many were played, and on how many the returns differed. "
        f"'vs baseline' is paired: the baseline's mean on the variant's own episodes.{sequential}",
        "Normalized score: (return - random) / (baseline - random) on the variant's episodes; 100% is the baseline.",
        f"Agreement is the share of greedy actions equal to the baseline's on {ev['heldout_episodes']} held-out episodes "
        f"(seeds {ev['heldout_seed']}..), which no calibration, fine-tune or return evaluation used; a policy can keep "
        "its return with low agreement where actions are near-tied. 'Decisive' is the same share on the half of "
        "those states where the baseline's gap between its best and second-best Q-value is largest.",
        "Gzip is where sparsity shows: a pruned TFLite file is about as large as a dense one until compressed; "
        "size ratios compare gzip to gzip.",
        "MCU arena: the tensor arena TensorFlow Lite Micro needs for the policy, measured with its interpreter, "
        "plus a 25% margin (at least 1 KiB); the model's flash is the .tflite's size, and TFLite Micro's own code "
        "adds about 16-22 KB of flash on a Cortex-M (TFLM's docs: 16 KB core runtime on a Cortex M3, 22 KB with a "
        "keyword model's operators; not measured here). A 'fits' line counts the arena with margin against RAM "
        "and the model plus 22 KB against flash. '-' where it does not run there (results.json's micro.reason says why).",
    ]
    if results.gpu and results.gpu != "visible":
        notes.append(f"GPU figures: {results.gpu}.")
    notes += _candidate_notes(results)
    train = results.train or {}
    source = train.get("source")
    if train.get("env_steps") is not None and not source:
        kept = (f"; kept the weights of step {train['selected_step']:,} (periodic evaluation {train['selected_eval_return']:.1f})"
                if train.get("selected_step") is not None else "; kept the last weights")
        notes.insert(0, f"Baseline: trained {train['env_steps']:,} environment steps in {train['wall_seconds']:.0f} s{kept}.")
    if source:
        data = source.get("data", {})
        how = (f"a {data.get('steps')}-step epsilon={data.get('epsilon')} rollout of it" if data.get("kind") == "rollout"
               else f"{data.get('transitions')} transitions from {data.get('path')}")
        notes.insert(0, f"Baseline: not trained here but loaded from {source['from']} (SHA-256 "
                        f"{source.get('sha256', '?')[:12]}...); calibration, distillation and fine-tuning used {how}.")
        if results.port_check is not None:
            notes.insert(1, results.port_check.summary())
    return notes


def _candidate_notes(results: RunResults) -> list[str]:
    """One line per variant built as the best of several candidates: what each scored, which was kept."""
    notes = []
    for v in results.variants:
        picked = _get(v.compression, "candidates")
        if picked is None:
            continue
        scores = ", ".join(f"{d:+.1f}" for d in picked["fresh_differences"])
        notes.append(f"{v.name}: the best of {picked['count']} builds by their paired difference from the baseline on "
                     f"{picked['episodes']} fresh episodes (seeds {picked['seed']}.., used by nothing else): {scores}; "
                     f"kept build {picked['picked']}. Its verdict comes from the evaluation episodes, not these.")
    return notes


def render_markdown(results: RunResults, plots: Sequence[str]) -> str:
    table = rows(results)
    lines = [f"# compress-dqn report: {results.env_id}", ""]
    lines += [f"- **{line}**" for line in headline(results)] + [""]
    lines.append("| " + " | ".join(c[0] for c in _COLUMNS) + " |")
    lines.append("|" + "---|" * len(_COLUMNS))
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in table]
    lines.append("")
    lines += [f"![{name}]({name})" for name in plots]
    lines += ["", "Notes:", ""] + [f"- {note}" for note in _notes(results)]
    return "\n".join(lines) + "\n"


def render_html(results: RunResults, plots: dict[str, bytes]) -> str:
    """One self-contained page: headline, table, plots embedded as data URIs."""
    esc = html.escape
    head = "".join(f"<li>{esc(line)}</li>" for line in headline(results))
    header = "".join(f"<th>{esc(c[0])}</th>" for c in _COLUMNS)
    body = ""
    for r in rows(results):
        cells = _cells(r)
        color = _color(r["verdict"])
        tds = "".join(
            f'<td style="color:{color};font-weight:600">{esc(c)}</td>' if i == 4 else f"<td>{esc(c)}</td>"
            for i, c in enumerate(cells)
        )
        body += f"<tr>{tds}</tr>"
    images = "".join(
        f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></figure>'
        for name, data in plots.items()
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in _notes(results))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>compress-dqn: {esc(results.env_id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1400px; padding: 0 1rem; color: #222; }}
.wide {{ overflow-x: auto; }}
.headline {{ background: #f3f7fb; border-left: 4px solid #4575b4; padding: 0.6rem 1.2rem; font-size: 1.05rem; }}
table {{ border-collapse: collapse; font-size: 0.85rem; margin: 1rem 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
th {{ background: #fafafa; }}
figure {{ display: inline-block; margin: 0.5rem; }} img {{ max-width: 560px; }}
</style></head><body>
<h1>compress-dqn report: {esc(results.env_id)}</h1>
<ul class="headline">{head}</ul>
<div class="wide"><table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div>
{images}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""


def render_aggregate_markdown(results: SeedsResults) -> str:
    """The report of a multi-seed run: IQM over seeds with stratified-bootstrap CIs."""
    seeds = results.seeds
    lines = [
        f"# compress-dqn report: {results.env_id}, {len(seeds)} training seeds",
        "",
        f"Each seed's full report is in seed-N/report.html. Returns are the interquartile mean (IQM) over "
        f"seeds {seeds} of each seed's mean return (over {results.eval['episodes']} episodes, or more where a "
        "verdict needed them: the number is next to each verdict), with 95% "
        "stratified-bootstrap CIs (Agarwal et al., 2021); the difference is taken per seed against that "
        "seed's own baseline, paired on the episodes the variant played."
        + (f" With {len(seeds)} seeds the IQM trims nothing (it is the mean) and the CI spans about the lowest to the "
           "highest seed: read it as the seeds' range, not as a 95% interval." if len(seeds) < 4 else ""),
        "",
        "| variant | IQM return | 95% CI | IQM difference vs baseline | 95% CI | per-seed mean returns | "
        "per-seed verdicts (episodes) | gzipped bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in results.aggregate:
        verdicts = ", ".join(f"{v} ({n})" for v, n in zip(a.per_seed_verdict, a.per_seed_episodes))
        lines.append(
            f"| {a.name} | {a.iqm_return:.1f} | [{a.iqm_return_ci95[0]:.1f}, {a.iqm_return_ci95[1]:.1f}] | "
            f"{a.iqm_difference_vs_baseline:+.1f} | [{a.difference_ci95[0]:.1f}, {a.difference_ci95[1]:.1f}] | "
            f"{', '.join(f'{x:.1f}' for x in a.per_seed_mean_return)} | {verdicts} | {a.tflite_gzip_bytes:,} |"
        )
    kept = [a.name for a in results.aggregate[1:] if all(keeps_return(v) for v in a.per_seed_verdict)]
    if len(results.aggregate) > 1:
        lines += ["", f"Within tolerance on every seed: {', '.join(kept) if kept else 'none'}."]
    elif not results.search:
        lines += ["", NO_VARIANTS]
    if results.search:
        lines += [""] + render_search_markdown(results.search)
    return "\n".join(lines) + "\n"


def render_search_markdown(search: dict[str, Any]) -> list[str]:
    """The search section: winner, front, every candidate with why it was kept or dropped, cost."""
    unit = {"gzip_bytes": "gzipped bytes", "params": "nonzero parameters", "latency": "TFLite p50 us"}[search["objective"]]
    cost = search["cost"]
    winner = (f"**{search['winner']}** ({search['winner_objective']:,.0f} {unit}, median over seeds)"
              if search["winner"] else "**none** kept the return on every seed")
    lines = [
        "## Search: the smallest policy within tolerance on every seed",
        "",
        f"- Winner: {winner}.",
        f"- Front (objective vs mean normalized score, among the kept candidates): {', '.join(search['front']) or 'none'}.",
        f"- Cost: {cost['wall_seconds']:,.0f} s wall, {cost['candidates_played']} candidates played, "
        f"{cost['units']} (seed, candidate) units.",
        "",
        "| candidate | family | estimated weight bytes | outcome | objective (median) | per-seed verdicts (episodes) |",
        "|---|---|---|---|---|---|",
    ]
    for t in search["tried"]:
        verdicts = ", ".join(f"{seed}: {_seed_verdict(o)}" for seed, o in t["per_seed"].items()) or "-"
        objective = f"{t['objective']:,.0f}" if t["objective"] is not None else "-"
        lines.append(f"| {t['name']} | {t['family']} | {t['estimated_bytes']:,.0f} | {t['outcome']} | {objective} | {verdicts} |")
    lines += ["", "Each ladder is bisected for its smallest rung that keeps the return (a candidate is dropped at its "
              "first losing seed; a rung whose weights alone outweigh the best kept policy is skipped unplayed)."]
    return lines


def _seed_verdict(outcome: dict) -> str:
    """'within 1% (400)'; an open verdict also says about how many episodes would decide it."""
    text = f"{outcome['verdict']} ({outcome['episodes']:,}"
    if outcome.get("episodes_to_decide"):
        text += f"; ~{outcome['episodes_to_decide']:,} to decide"
    return text + ")"


def write_report(run_dir: Path) -> list[Path]:
    """(Re)write results.csv, report.md, report.html and the plots from run_dir/results.json."""
    run_dir = Path(run_dir)
    source = run_dir / "results.json"
    if not source.is_file():
        raise UserError(f"{run_dir}: no results.json; pass a run directory written by compress-dqn run")
    try:
        results = load_results(source)
        if isinstance(results, SeedsResults):  # a multi-seed run: the per-seed reports live in seed-N/
            markdown = render_aggregate_markdown(results)
            write_text_atomic(run_dir / "report.md", markdown)
            return [run_dir / "report.md"]
        table = rows(results)
    except (json.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise UserError(f"{source}: not a compress-dqn results file ({type(exc).__name__}: {exc})") from None
    written = []
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(table[0]))
    writer.writeheader()
    writer.writerows(table)
    write_text_atomic(run_dir / "results.csv", buffer.getvalue())
    written.append(run_dir / "results.csv")
    plots = make_plots(results)
    for name, data in plots.items():
        write_bytes_atomic(run_dir / name, data)
        written.append(run_dir / name)
    write_text_atomic(run_dir / "report.md", render_markdown(results, list(plots)))
    write_text_atomic(run_dir / "report.html", render_html(results, plots))
    written += [run_dir / "report.md", run_dir / "report.html"]
    return written
