"""What a run's figures say, apart from how the report words them: the smallest and fastest keepers, the open
verdicts and the episodes that would decide them, what fits a microcontroller (under TFLite Micro, and as C with no
runtime), the search winner, serving memory.

The report (evaluation.report) renders these; a finding is computed once here, so the markdown,
the HTML page and a test read the same answer. It reads results.json's figures only: why a variant lost
the return, measured again on the run's .tflite files, is evaluation.diagnosis. No TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compress_dqn.deploy.micro_figures import TFLM_RUNTIME_FLASH
from compress_dqn.evaluation.figures import M4F, ONE_PERCENT, AtOnePercent, Comparison, Verdict
from compress_dqn.evaluation.results import RunResults, VariantResult
from compress_dqn.evaluation.verdicts import episodes_to_decide

MICRO_BUDGETS = (32 * 1024, 256 * 1024)
"""RAM and flash of the microcontroller parts a `fits` finding names, smallest first."""


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


# Figures of one policy that may be missing (not measured, not probed, not run): None then.

def tflite_p50(v: VariantResult) -> float | None:
    return v.latency_us.cpu.tflite.p50 if v.latency_us.cpu.tflite else None


def tflite_p99(v: VariantResult) -> float | None:
    return v.latency_us.cpu.tflite.p99 if v.latency_us.cpu.tflite else None


def saved_model_p50(v: VariantResult) -> float | None:
    return v.latency_us.cpu.saved_model.p50 if v.latency_us.cpu.saved_model else None


def tflite_peak_rss(v: VariantResult) -> int | None:
    return v.memory_bytes.cpu_rss.tflite.peak_rss if v.memory_bytes.cpu_rss.tflite else None


def saved_model_peak_rss(v: VariantResult) -> int | None:
    return v.memory_bytes.cpu_rss.saved_model.peak_rss if v.memory_bytes.cpu_rss.saved_model else None


def micro_flash(v: VariantResult) -> int | None:
    """The model array's flash, where TFLite Micro runs the policy."""
    return v.micro.flash_bytes if v.micro is not None and v.micro.runs else None


def micro_arena(v: VariantResult) -> int | None:
    """The tensor arena with its margin, where TFLite Micro runs the policy."""
    return v.micro.arena_bytes_with_margin if v.micro is not None else None


def c_flash_ram(v: VariantResult, target: str) -> tuple[int, int] | None:
    """The generated C policy's measured (flash, RAM) bytes on `target`, where it has them."""
    return v.c_policy.on(target) if v.c_policy is not None else None


def has_c_figures(results: RunResults) -> bool:
    """Whether some policy of the run has measured C figures (runs before them, or without the `c` extra, have none)."""
    return any(v.c_policy is not None and v.c_policy.flash_bytes for v in results.variants)


def difference(v: VariantResult) -> float:
    """The paired mean difference from the baseline (0 for the baseline itself)."""
    return v.return_vs_baseline.mean if v.return_vs_baseline else 0.0


def difference_ci(v: VariantResult) -> tuple[float, float]:
    return v.return_vs_baseline.ci if v.return_vs_baseline else (0.0, 0.0)


def baseline_same_episodes(v: VariantResult) -> float | None:
    """The baseline's mean on the variant's own episodes (None for the baseline)."""
    return v.returns.mean - v.return_vs_baseline.mean if v.return_vs_baseline else None


def lead_over_random(results: RunResults) -> float:
    return results.baseline.returns.mean - results.random.returns.mean


def normalized_score(v: VariantResult, results: RunResults) -> float | None:
    """(return - random) / (baseline - random) on the variant's episodes; the baseline's 1.0, unless it
    does not beat the random policy (no scale)."""
    if v.return_vs_baseline is not None:
        return v.return_vs_baseline.normalized_score
    return 1.0 if lead_over_random(results) > 0 else None


def to_decide(versus: Comparison | None) -> int | None:
    """The episode estimate of an inconclusive verdict, recomputed from its CI (an estimate stored by
    an older version of the rule would otherwise be re-rendered as it was)."""
    if versus is None or versus.verdict is not Verdict.INCONCLUSIVE:
        return None
    lo, hi = versus.ci
    return episodes_to_decide(versus.episodes, lo, hi, versus.mean, versus.margin)


def at_one_percent(v: VariantResult) -> AtOnePercent | None:
    """A variant's verdict at 1% on its own episodes, where the run decided at a wider tolerance."""
    return v.return_vs_baseline.at_one_percent if v.return_vs_baseline else None


@dataclass(frozen=True)
class Speed:
    """The quickest keeper (TFLite, batch 1, p50) and whether it beats the fp32 TFLite baseline."""

    fastest: VariantResult
    faster: bool


@dataclass(frozen=True)
class MicroFit:
    """The smallest part (RAM and flash of `budget` bytes) some keepers fit, and the smallest of them."""

    budget: int
    count: int
    best: VariantResult
    runtime_bytes: int
    """TFLite Micro's own code in flash with a keyword model's kernels (its original README), not measured here."""


@dataclass(frozen=True)
class Undecided:
    name: str
    episodes_to_decide: int | None


@dataclass(frozen=True)
class ServingMemory:
    """The baseline's peak RSS served by TFLite and by TensorFlow."""

    tflite_peak_rss: int
    saved_model_peak_rss: int
    baseline_only: bool
    """TensorFlow's figure was probed for the baseline alone (measure.saved_model_memory: baseline)."""


@dataclass(frozen=True)
class Findings:
    """What the headline says about one run."""

    baseline: VariantResult
    random_mean: float
    has_variants: bool
    weak_baseline: bool
    """The baseline does not beat a uniform-random policy: the tolerance has no scale."""
    keepers: list[VariantResult]
    smallest: VariantResult | None
    speed: Speed | None
    worse: list[str]
    undecided: list[Undecided]
    micro_fit: MicroFit | None
    c_smallest: VariantResult | None
    """The keeper whose generated C takes the least flash on a Cortex-M4F, where some keeper has C figures."""
    search_winner: str | None
    search_objective: str | None
    serving_memory: ServingMemory | None
    wide_tolerance: float | None
    """eval.tolerance where it is wider than 1% (the headline then names it); None at 1% or below."""
    search_winner_policy: VariantResult | None
    """The search winner as this seed's run played it (its verdict at 1% is at_one_percent of it)."""


def _speed(base: VariantResult, keepers: list[VariantResult]) -> Speed | None:
    timed = [v for v in keepers if tflite_p50(v) is not None]
    if not timed or tflite_p50(base) is None:
        return None
    fast = min(timed, key=tflite_p50)
    return Speed(fast, tflite_p50(fast) < tflite_p50(base))


def _micro_fit(keepers: list[VariantResult]) -> MicroFit | None:
    runtime = TFLM_RUNTIME_FLASH.high_bytes
    on_micro = [v for v in keepers if micro_arena(v) is not None]
    for budget in MICRO_BUDGETS:
        fits = [v for v in on_micro if micro_arena(v) <= budget and micro_flash(v) + runtime <= budget]
        if fits:
            return MicroFit(budget, len(fits), min(fits, key=lambda v: micro_arena(v) + micro_flash(v)), runtime)
    return None


def _serving_memory(results: RunResults) -> ServingMemory | None:
    base = results.baseline
    if not (tflite_peak_rss(base) and saved_model_peak_rss(base)):
        return None
    only = any(tflite_peak_rss(v) and not saved_model_peak_rss(v) for v in results.variants[1:])
    return ServingMemory(tflite_peak_rss(base), saved_model_peak_rss(base), only)


def findings(results: RunResults) -> Findings:
    """The findings of one run, in the order the headline gives them."""
    base, variants = results.baseline, results.variants[1:]
    keepers = [v for v in variants if v.verdict.keeps_return]
    search = results.search
    return Findings(
        baseline=base,
        random_mean=results.random.returns.mean,
        has_variants=bool(variants),
        weak_baseline=bool(variants) and lead_over_random(results) <= 0,
        keepers=keepers,
        smallest=min(keepers, key=lambda v: v.size.tflite_gzip_bytes) if keepers else None,
        speed=_speed(base, keepers),
        worse=[v.name for v in variants if v.verdict is Verdict.WORSE],
        undecided=[Undecided(v.name, to_decide(v.return_vs_baseline)) for v in variants
                   if v.verdict is Verdict.INCONCLUSIVE],
        micro_fit=_micro_fit(keepers),
        c_smallest=min((v for v in keepers if c_flash_ram(v, M4F)), key=lambda v: c_flash_ram(v, M4F)[0], default=None),
        search_winner=search.winner if search else None,
        search_objective=search.objective if search else None,
        serving_memory=_serving_memory(results),
        wide_tolerance=results.eval.tolerance if results.eval.tolerance > ONE_PERCENT else None,
        search_winner_policy=next((v for v in variants if search and v.name == search.winner), None),
    )


def loses_return(v: VariantResult) -> bool:
    """A variant whose verdict does not keep the return (worse, or not decided)."""
    return v.return_vs_baseline is not None and not v.verdict.keeps_return


def _recipe_fields(v: VariantResult) -> dict:
    """The variant's recipe blocks as results.json keeps them (quantize, student, prune...); none for the baseline."""
    return (v.compression.model_extra or {}) if v.compression is not None else {}


def is_student(v: VariantResult) -> bool:
    """A distilled student: its recipe has a `student` block (a file before blocks were kept: its preset's name)."""
    if _recipe_fields(v).get("student"):
        return True
    return v.name.startswith("student-")


def post_training_int8(v: VariantResult) -> bool:
    """The baseline's own weights quantized after training (ptq-int8): no student, pruning, clustering or fine-tune."""
    fields = _recipe_fields(v)
    quantize = fields.get("quantize") or {}
    return (quantize.get("mode") == "int8" and not fields.get("student") and not fields.get("prune")
            and not fields.get("cluster") and not fields.get("fine_tune"))


def float_heads_note(v: VariantResult) -> str:
    """The end of a microcontroller figure's sentence: where a QAT policy's Q-value heads stay float on
    its int8 body (quantize.float_head), the reader needs to know the file carries float kernels."""
    if not (_recipe_fields(v).get("quantize") or {}).get("float_head"):
        return "."
    return ("; int8 activations up to its Q-value heads, which stay float (a DEQUANTIZE, then TFLite Micro's "
            "float kernels).")
