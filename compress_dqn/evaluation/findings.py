"""What a run's figures say, apart from how the report words them: the smallest and fastest keepers, the open
verdicts and the episodes that would decide them, what fits a microcontroller (under TFLite Micro, and as C with no
runtime), the search winner, serving memory.

The report (evaluation.report) renders these; a finding is computed once here, so the markdown,
the HTML page and a test read the same answer. No TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


# Why a variant lost the return: measured on the held-out states the baseline visits (issue 58).

COARSE_HEAD_SHARE = 0.05
"""A Q-head's int8 step is named the reason where at least this share of the decisive states has an action gap below it,"""
COARSE_HEAD_DIFFERING = 0.5
"""or where at least this share of the states on which the variant's action differs does (MountainCar's DQN: a
32x32 student's head step of 0.135 was below the gap of 81% of the states it got wrong, ptq-int8's 0.017 of 25%)."""


@dataclass(frozen=True)
class Diagnosis:
    """What the held-out states show about one variant: the baseline's action gaps (best minus second-best
    Q-value) against the variant's int8 Q-head step, and where the variant's greedy action differs."""

    name: str
    states: int
    student: bool
    gap_median: float
    """The baseline's median gap: a state is decisive where its gap is at least this (run/context.decisive_states)."""
    decisive_agreement: float
    """Share of the decisive states where the variant plays the baseline's action."""
    differing: float
    """Share of all the states where it does not."""
    differing_gap_median: float | None
    """The baseline's median gap on the states where the variant's action differs (None where none does)."""
    output_step: float | None
    """The int8 step of the tensor the action is the argmax of (its quantization scale); None for a float head."""
    below_step_decisive: float | None
    """Share of the decisive states whose gap is below one output step (None for a float head)."""
    below_step_all: float | None
    """Share of all the states whose gap is below one output step."""
    differing_below_step: float | None
    """Share of the states where the action differs whose gap is below one output step."""
    gap_to_q: float | None = None
    """The baseline's median over the states of gap / mean |Q|: how fine a difference between Q-values of one
    magnitude its decisions take (int8 holds about 1/127 of a tensor's range)."""
    float_head_agreement: float | None = None
    """Post-training int8 of the baseline's own weights: its agreement with the baseline on all the states were its
    Q-head float (its int8 body's last activation, dequantized, times the baseline's float output layer); None for
    other variants. Where it is near 1 the int8 head (weights and step) is what changed the actions, else the body."""

    @property
    def head_share(self) -> float | None:
        """Of the states where the action differs, the share a float Q-head gets back (float_head_agreement's)."""
        if self.float_head_agreement is None or self.differing == 0:
            return None
        return max(0.0, self.float_head_agreement - (1 - self.differing)) / self.differing

    @property
    def coarse_head(self) -> bool:
        """The Q-head's step is the measured reason: it cannot resolve the gaps of enough decisive states."""
        if self.below_step_decisive is None:
            return False
        return self.below_step_decisive >= COARSE_HEAD_SHARE or (self.differing_below_step or 0.0) >= COARSE_HEAD_DIFFERING


def action_gaps(q_values: np.ndarray) -> np.ndarray:
    """Best minus second-best Q-value of each state (0 where there is one action)."""
    q = np.asarray(q_values)
    if q.shape[1] < 2:
        return np.zeros(len(q))
    top_two = np.sort(q, axis=1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0]


def diagnose(name: str, baseline_q: np.ndarray, baseline_actions: np.ndarray, actions: np.ndarray,
             output_step: float | None, student: bool = False, float_head_actions: np.ndarray | None = None) -> Diagnosis:
    """One variant's diagnosis from the baseline's Q-values and actions and the variant's actions on the same states."""
    gap = action_gaps(baseline_q)
    median = float(np.median(gap))
    decisive = gap >= median
    differs = np.asarray(actions) != np.asarray(baseline_actions)
    below = gap < output_step if output_step else None
    return Diagnosis(
        name=name, states=len(gap), student=student, gap_median=median,
        decisive_agreement=float(1 - differs[decisive].mean()), differing=float(differs.mean()),
        differing_gap_median=float(np.median(gap[differs])) if differs.any() else None,
        output_step=float(output_step) if output_step else None,
        below_step_decisive=float(below[decisive].mean()) if below is not None else None,
        below_step_all=float(below.mean()) if below is not None else None,
        differing_below_step=float(below[differs].mean()) if below is not None and differs.any() else None,
        gap_to_q=float(np.median(gap / np.maximum(np.abs(np.asarray(baseline_q, np.float64)).mean(axis=1), 1e-12))),
        float_head_agreement=(float(np.mean(np.asarray(float_head_actions) == np.asarray(baseline_actions)))
                              if float_head_actions is not None else None),
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


def _policy_graph(tflite: Path) -> Any:
    """The file's policy graph; None where it is no policy graph this reader knows."""
    from compress_dqn.deploy.tflite.graph import read_policy_graph
    from compress_dqn.errors import UserError

    try:
        return read_policy_graph(tflite)
    except (UserError, ValueError, KeyError, StopIteration):
        return None


def head_step(tflite: Path | Any) -> float | None:
    """The quantization step of the tensor a policy's `action` is the argmax of (a file, or its policy
    graph); None where it is float (a float Q-head, or a float policy), or where the file is no policy
    graph this reader knows."""
    graph = _policy_graph(tflite) if isinstance(tflite, (str, Path)) else tflite
    head = graph.action_head if graph is not None else None
    if head is None or not head.quantized:
        return None
    return float(np.max(head.scales))


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


class FloatHeadPolicy:
    """A post-training int8 policy were its Q-head float: LiteRT runs the file keeping every tensor, the head's int8
    input is dequantized and multiplied by the baseline's float output layer (the file's split heads take the same
    argmax). Greedy actions of a batch, as TFLitePolicy.actions."""

    CHUNK = 1024
    """States per interpreter call: every tensor is kept, so a call's memory grows with its batch (an image CNN's)."""

    def __init__(self, tflite: Path, hidden: Any, kernel: np.ndarray, bias: np.ndarray) -> None:
        from compress_dqn.deploy.litert.policy import TFLitePolicy

        self._policy = TFLitePolicy(tflite, keep_tensors=True)
        self._hidden, self._kernel, self._bias = hidden, kernel, bias

    def actions(self, states: np.ndarray) -> np.ndarray:
        if len(states) > self.CHUNK:
            return np.concatenate([self.actions(states[i:i + self.CHUNK]) for i in range(0, len(states), self.CHUNK)])
        self._policy.actions(states)
        hidden = self._hidden
        h = (self._policy.tensor(hidden.index).astype(np.float64) - float(hidden.zero_points[0])) * float(hidden.scales[0])
        return (h.reshape(len(states), -1) @ self._kernel + self._bias).argmax(1)


def float_head_policy(tflite: Path, weights: Path, graph: Any = None) -> FloatHeadPolicy | None:
    """FloatHeadPolicy of a post-training int8 file (or its policy graph, read already) with the baseline's output
    layer (the last kernel and bias of baseline/weights.npz); None where the file has no quantized fully connected
    head or the shapes do not match (a baseline whose last arrays are not its output layer)."""
    if not Path(weights).is_file():
        return None
    graph = graph if graph is not None else _policy_graph(tflite)
    head = next((op for op in graph.ops if op.outputs[0] is graph.action_head), None) if graph is not None else None
    if head is None or head.kind != "FULLY_CONNECTED" or not head.inputs[0].quantized:
        return None
    hidden = head.inputs[0]
    with np.load(weights) as arrays:
        names = sorted(arrays.files)
        if len(names) < 2:
            return None
        kernel, bias = (arrays[k].astype(np.float64) for k in names[-2:])
    if kernel.ndim != 2 or kernel.shape != (hidden.shape[-1], graph.n_actions) or bias.shape != (graph.n_actions,):
        return None
    return FloatHeadPolicy(tflite, hidden, kernel, bias)


def diagnoses(results: RunResults, run_dir: Path) -> list[Diagnosis]:
    """Each variant's diagnosis, measured now on the run's held-out states with the baseline's and the
    variant's TFLite files (LiteRT only); [] where the run directory lacks them (a results.json alone)."""
    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.errors import UserError
    from compress_dqn.fileio import load_dict

    run_dir = Path(run_dir)
    base = results.baseline
    base_file = run_dir / base.artifacts.get("tflite", "")
    heldout = base_file.parent / "heldout_obs.npz"
    if not (base_file.is_file() and heldout.is_file()):
        return []
    states = load_dict(heldout)["observations"]
    if not len(states):
        return []
    reference = TFLitePolicy(base_file)
    baseline_q, baseline_actions = reference.q_values(states), reference.actions(states)
    found = []
    for v in results.variants[1:]:
        path = run_dir / v.artifacts.get("tflite", "")
        if not path.is_file():
            continue
        graph, emulated = _policy_graph(path), None
        if post_training_int8(v) and graph is not None:
            try:
                policy = float_head_policy(path, base_file.parent / "weights.npz", graph)
                emulated = policy.actions(states) if policy is not None else None
            except (UserError, ValueError, RuntimeError):
                emulated = None
        found.append(diagnose(v.name, baseline_q, baseline_actions, TFLitePolicy(path).actions(states),
                              head_step(graph), student=is_student(v), float_head_actions=emulated))
    return found
