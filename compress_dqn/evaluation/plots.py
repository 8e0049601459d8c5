"""The report's PNG plots: return against size, latency and memory (Pareto front drawn), latency and memory bars.

matplotlib is an optional extra, imported where a plot is drawn. No TensorFlow.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

from compress_dqn.evaluation import findings as find
from compress_dqn.evaluation.figures import Verdict
from compress_dqn.evaluation.results import RunResults, VariantResult

Figure = Callable[[VariantResult], float | int | None]
"""A policy's cost on a plot's axis (None or 0: not measured, left off)."""

_VERDICT_COLORS = {Verdict.REFERENCE: "#333333", Verdict.BETTER: "#1a9850", Verdict.WITHIN: "#4575b4",
                   Verdict.INCONCLUSIVE: "#fdae61", Verdict.WORSE: "#d73027"}


def verdict_color(verdict: Verdict | None) -> str:
    """Verdict colour; every "within N%" shares one."""
    return _VERDICT_COLORS.get(verdict, "#999999")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure_bytes(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def plot_return_vs(results: RunResults, cost: Figure, what: str, unit: str, title: str, scale: float = 1.0) -> bytes | None:
    """Return (with 95% CI) against a cost (divided by scale), on a log axis where the costs span more
    than 20x (a linear one otherwise: log ticks over 48-51 MiB read as 4.8x10^7); Pareto front
    highlighted; points labelled."""
    plt = _pyplot()
    table = [v for v in results.variants if cost(v)]
    if not table:
        return None
    costs = [cost(v) / scale for v in table]
    means = [v.returns.mean for v in table]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    # The front is drawn over the baseline and the variants that keep its return: a worse or undecided
    # variant's point estimate is not a trade-off the report offers.
    eligible = [i for i, v in enumerate(table) if v.verdict is Verdict.REFERENCE or v.verdict.keeps_return]
    front = [eligible[j] for j in find.pareto_front([costs[i] for i in eligible], [means[i] for i in eligible])]
    ax.plot([costs[i] for i in front], [means[i] for i in front], "-", color="#bbbbbb", lw=6, alpha=0.6, zorder=1)
    ax.plot([costs[i] for i in front], [means[i] for i in front], "o", ms=16, mfc="none", mec="#888888", mew=2,
            zorder=2, label="Pareto front (policies that keep the return)")
    # Stagger labels left to right so points at the same return (CartPole's 500s) stay readable.
    order = sorted(range(len(table)), key=lambda i: costs[i])
    offsets = [(6, 8), (6, -14), (6, 20), (6, -26)]
    for rank, i in enumerate(order):
        v, at, mean = table[i], costs[i], means[i]
        low, high = v.returns.ci95
        ax.errorbar(at, mean, yerr=[[mean - low], [high - mean]], fmt="o", color=verdict_color(v.verdict),
                    ms=8 if v.name == "baseline" else 6, capsize=3, zorder=3)
        ax.annotate(v.name, (at, mean), textcoords="offset points", xytext=offsets[rank % len(offsets)],
                    fontsize=8, arrowprops={"arrowstyle": "-", "color": "#cccccc", "lw": 0.6})
    base = next((v for v in table if v.name == "baseline"), None)
    if base is not None:
        ax.axhline(base.returns.mean, ls="--", lw=0.8, color="#333333", zorder=0, label="baseline return")
    for label, verdict in {v.label: v.verdict for v in table}.items():
        ax.plot([], [], "o", color=verdict_color(verdict), label=label)
    wide = max(costs) > 20 * min(costs)
    if wide:
        ax.set_xscale("log")
    ax.set_xlabel(f"{what} ({unit}{', log' if wide else ''})")
    ax.set_ylabel(f"mean return over {results.eval.episodes}+ episodes (95% CI)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
    data = _figure_bytes(fig)
    plt.close(fig)
    return data


def plot_bars(results: RunResults, bars: Sequence[tuple[Figure, str]], xlabel: str, title: str,
              scale: float = 1.0) -> bytes | None:
    """Horizontal bars per variant for one or two runtimes (log axis)."""
    plt = _pyplot()
    table = results.variants
    if not any(figure(v) for v in table for figure, _ in bars):
        return None
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(table) + 1.2))
    height = 0.8 / len(bars)
    for k, (figure, label) in enumerate(bars):
        values = [(figure(v) or 0) / scale for v in table]
        positions = [i + k * height for i in range(len(table))]
        ax.barh(positions, values, height=height, label=label)
        for y, value in zip(positions, values):
            if value:
                ax.text(value, y, f" {value:.3g}", va="center", fontsize=7)
    ax.set_yticks([i + height * (len(bars) - 1) / 2 for i in range(len(table))])
    ax.set_yticklabels([v.name for v in table], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    for k, (figure, _) in enumerate(bars):  # a runtime measured for some policies only: say so, not a blank
        if any(figure(v) for v in table):
            for i, v in enumerate(table):
                if figure(v) is None:
                    ax.text(ax.get_xlim()[0], i + k * height, " not probed", va="center", fontsize=7, color="#777777")
    ax.set_xlabel(xlabel)
    ax.set_title(title, pad=24)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(bars), frameon=False)
    ax.grid(True, axis="x", which="both", alpha=0.25)
    data = _figure_bytes(fig)
    plt.close(fig)
    return data


def make_plots(results: RunResults) -> dict[str, bytes]:
    """PNG bytes by file name."""
    plots = {
        "return_vs_size.png": plot_return_vs(results, lambda v: v.size.tflite_gzip_bytes, "TFLite file size, gzipped",
                                             "bytes", f"{results.env_id}: return vs policy size"),
        "return_vs_latency.png": plot_return_vs(results, find.tflite_p50, "TFLite action latency p50", "us",
                                                f"{results.env_id}: return vs latency"),
        "return_vs_memory.png": plot_return_vs(results, find.tflite_peak_rss, "TFLite process peak RSS", "MiB",
                                               f"{results.env_id}: return vs inference memory", scale=2**20),
        "latency.png": plot_bars(results, [(find.tflite_p50, "TFLite (LiteRT)"), (find.saved_model_p50, "SavedModel (TensorFlow)")],
                                 "batch-1 action latency p50 (us, log)", "Latency per variant"),
        "memory.png": plot_bars(results, [(find.tflite_peak_rss, "TFLite process"),
                                          (find.saved_model_peak_rss, "TensorFlow process")],
                                "peak RSS (MiB, log)", "Inference memory per variant", scale=2**20),
    }
    return {name: data for name, data in plots.items() if data is not None}
