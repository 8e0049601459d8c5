"""Why variants lost the return, in the report's words: for each losing variant what its held-out
states measured (evaluation.diagnosis.diagnoses: action gaps, an int8 Q-head's step, agreement on
decisive states, a float head emulated for post-training int8), then which variants held."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compress_dqn.errors import UserError
from compress_dqn.evaluation import findings as find
from compress_dqn.evaluation.diagnosis import Diagnosis, diagnoses
from compress_dqn.evaluation.results import RunResults, VariantResult

__all__ = ["REASONS_NOTE", "diagnosed_variants", "reason_lines"]


def _share(x: float) -> str:
    return f"{100 * x:.1f}%"


def _reason(v: VariantResult, d: Diagnosis) -> str:
    """Why one variant lost the return, in the words of what its held-out states measured."""
    lo, hi = find.difference_ci(v)
    lead = f"{v.name} ({v.label}, {find.difference(v):+.1f} [{lo:.1f}, {hi:.1f}])"
    agrees = (f"it plays the baseline's action on {_share(d.decisive_agreement)} of the decisive states (gap at least "
              f"{d.gap_median:.3g}, the median)")
    where = (f" and differs on {_share(d.differing)} of all {d.states} states, where the baseline's median gap is "
             f"{d.differing_gap_median:.3g}" if d.differing_gap_median is not None else " and never differs")
    step = (f"its int8 Q-head decides in steps of {d.output_step:.3g}, more than the gap of "
            f"{_share(d.below_step_decisive)} of the decisive states, {_share(d.below_step_all)} of all states and "
            f"{_share(d.differing_below_step or 0.0)} of those where its action differs" if d.output_step else "")
    kind = "a student: " if d.student else ""
    if d.head_share is not None:  # post-training int8: the float head emulated tells the head from the body
        part = ("its int8 Q-head (weights and step)" if d.head_share >= 0.5 else
                "its int8 body (the hidden layers" + (f"; the baseline's gaps are a median {_share(d.gap_to_q)} of its "
                                                      "|Q|" if d.gap_to_q is not None else "") + ")")
        return (f"{lead}: {agrees}{where}; with a float Q-head (its int8 body's last activation times the baseline's "
                f"float output layer) it would play the baseline's action on {_share(d.float_head_agreement)} of all "
                f"states, {_share(d.head_share)} of those it changes: most of them come from {part}"
                + (f"; {step}" if step else "") + ".")
    if d.coarse_head:
        fix = (" A distillation that also fits the teacher's advantages (fine_tune.advantage_weight) fits the student's "
               "head range to them, and with it the step." if d.student else "")
        return (f"{lead}: {kind}{step}; the head's step rounds this policy's action gaps away. {agrees[0].upper()}{agrees[1:]}"
                f"{where}.{fix}")
    if d.decisive_agreement >= 0.99:
        why = "it loses on near-tied states, which add up over an episode" + (", not by its head's step" if step else "")
    else:
        why = "the network's own error, not a rounding of near-ties" + (" or its head's step" if step else "")
    return f"{lead}: {kind}{agrees}{where}" + (f"; {step}" if step else "") + f": {why}."


def reason_lines(results: RunResults, diagnosed: Sequence[Diagnosis]) -> list[str]:
    """For each variant that lost the return, what its held-out states show; then which variants held."""
    by_name = {d.name: d for d in diagnosed}
    losers = [v for v in results.variants[1:] if find.loses_return(v) and v.name in by_name]
    if not losers:
        return []
    held = [v.name for v in results.variants[1:] if v.verdict.keeps_return]
    return [_reason(v, by_name[v.name]) for v in losers] + [
        f"Held the return in this run: {', '.join(held)}." if held else "No variant of this run held the return."]


REASONS_NOTE = ("Measured on the held-out states with the run's TFLite files when this report was written: a state's "
                "gap is the baseline's best minus second-best Q-value; an int8 Q-head's step is the quantization "
                "scale of the tensor its action is the argmax of, and a gap below one step is one that the head "
                "rounds away or reverses.")


def diagnosed_variants(results: RunResults, run_dir: Path) -> list[Diagnosis]:
    """The losing variants' diagnoses (diagnosis.diagnoses); none where no variant lost, or where the files
    cannot be read (a copied results.json, a policy this LiteRT cannot run): the report is written without them."""
    if not any(find.loses_return(v) for v in results.variants[1:]):
        return []
    try:
        return diagnoses(results, run_dir)
    except (UserError, OSError, ValueError, RuntimeError):
        return []
