"""Deployment figures a reader can act on: a report's 'fits' line counts RAM and flash apart, flash
with TFLite Micro's own code (its docs' estimate), not the model array alone."""

import json
from pathlib import Path

from compress_dqn.evaluation.report import headline
from compress_dqn.evaluation.results import RunResults

FIXED = Path(__file__).parent / "data" / "results_lunarlander.json"


def _with_micro(flash: int, arena: int) -> RunResults:
    results = RunResults.from_dict(json.loads(FIXED.read_text()))
    for variant in results.variants:  # ptq-int8 is the one variant that keeps the return
        variant.micro = {"runs": True, "flash_bytes": flash, "arena_bytes": arena - 1024, "arena_bytes_with_margin": arena}
    return results


def test_a_fits_line_counts_the_arena_against_ram_and_the_model_plus_the_runtime_against_flash():
    (line,) = [x for x in headline(_with_micro(9_000, 8_000)) if x.startswith("Fits a microcontroller")]
    assert line.startswith("Fits a microcontroller with 32 KB of RAM and 32 KB of flash: 1 policy")
    assert ("RAM: 8,000 B tensor arena with margin; flash: 9,000 B model + ~22 KB of TFLite Micro's own code with a "
            "keyword model's kernels") in line


def test_a_model_that_leaves_no_flash_for_the_runtime_does_not_fit_32_kb():
    """11 KB of model and 2 KB of arena made 13 KB 'for model and arena together': it fit 32 KB,
    though TFLM's ~22 KB of code leaves a 32 KB part no room for an 11 KB model."""
    (line,) = [x for x in headline(_with_micro(11_000, 2_000)) if x.startswith("Fits a microcontroller")]
    assert line.startswith("Fits a microcontroller with 256 KB of RAM and 256 KB of flash")


def test_a_fits_line_says_when_the_policy_keeps_float_q_value_heads():
    """A QAT policy with float heads runs float kernels after its int8 body: the line says so, and
    says nothing of the kind for an int8 policy whose head is int8 too."""
    results = _with_micro(9_000, 8_000)
    (plain,) = [x for x in headline(results) if x.startswith("Fits a microcontroller")]
    assert "float" not in plain and plain.endswith("memory_footprint README).")
    for variant in results.variants:
        variant.compression = {"quantize": {"mode": "qat", "float_head": True}}
    (line,) = [x for x in headline(results) if x.startswith("Fits a microcontroller")]
    assert line.endswith("int8 activations up to its Q-value heads, which stay float (a DEQUANTIZE, then TFLite "
                         "Micro's float kernels).")
