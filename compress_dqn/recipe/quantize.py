"""The recipe's quantize block: post-training quantization or QAT, and which keys each mode takes.

MODE_ONLY is the one table of the keys that apply to some quantization modes only; a key set
away from its default under another mode is refused in one line naming the modes.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from compress_dqn.recipe.values import LearningRate, PositiveCount, QatTeacher, StrictModel, count_from

QuantizeMode = Literal["dynamic", "float16", "int8", "int16x8", "qat", "weight_only"]
QUANTIZE_MODES = get_args(QuantizeMode)

MODE_ONLY: dict[str, tuple[str, ...]] = {
    "float_head": ("qat",),
    "kernel_bits": ("qat",),
    "qat_teacher": ("qat",),
    "action_head": ("int8",),
    "input_scaling": ("int8", "int16x8"),
}
"""Key -> the quantization modes it applies to (checked in this order)."""

LOW_BIT_WITHOUT_CLUSTERING = "low-bit kernels are trained by QAT without clustering"
"""Why kernel_bits and a clustered student do not mix (the template's check and the old keys' say it alike)."""


def mode_only_refusal(key: str, mode: str) -> str:
    """The one-line refusal of `key` (set) under `mode`, which MODE_ONLY does not list for it."""
    modes = MODE_ONLY[key]
    if len(modes) == 1:
        return f"{key} applies to mode {modes[0]} only, not {mode}; remove it or use mode: {modes[0]}"
    return f"{key} applies to modes {' and '.join(modes)} only, not {mode}; remove it"


KernelBits = dict[str, Annotated[int, Field(ge=2, le=7)]]
"""Layer name -> its kernel's bits in QAT (compress.low_bit stores 2-7 bits exactly)."""


class QuantizeConfig(StrictModel):
    """Post-training quantization at TFLite conversion, or quantization-aware training (qat)."""

    mode: QuantizeMode
    """dynamic: int8 weights; float16: fp16 weights; int8: full integer (calibrated on replay
    observations); int16x8: int16 activations, int8 weights; qat: tfmot quantize_model + fine-tune;
    weight_only: every kernel in int8 (the output layer's in float16), widened to float at load, the
    activations float (deploy.tflite.weight_only: where int8 activations cost a small student the return)."""
    calibration_samples: PositiveCount = 1000
    """Replay observations in the representative dataset (int8, int16x8)."""
    int8_io: bool = False
    """Make the TFLite input and Q-value output int8 too (full-integer accelerators need it)."""
    normalize_input: bool = True
    """int8/int16x8/qat on flat float observations: give each feature its own range. The policy takes
    (obs - mean) / std (replay statistics, folded into the first layer; the loader applies it from
    the .tflite's metadata), so one input scale fits every feature."""
    input_scaling: Literal["std", "range"] = "std"
    """How normalize_input scales each feature for post-training int8/int16x8: std, (obs - mean) /
    std; range, (obs - midrange) / half-range, so every feature spans the whole int8 input range
    (compress.rewrites.input_range). QAT always uses std."""
    action_head: bool = False
    """int8: choose the action on a third int8 head (a tensor that feeds ARG_MAX) holding only the
    top of the advantage's range (compress.rewrites.with_action_head), not on the advantage head itself."""
    preserve: bool = True
    """For qat on a pruned or clustered model: keep its sparsity/clusters (PQAT/CQAT)."""
    per_channel_dense: bool = True
    """qat on a CNN: give the first Dense layer after the conv stack one kernel scale per unit, as
    post-training int8 gives Dense kernels (tfmot's QAT gives it one scale for the whole kernel).
    The layer is computed as an equivalent CONV_2D over the whole feature map
    (compress.rewrites.flattened_dense_as_conv): the same weights and outputs, and the converter
    keeps per-channel scales for convolutions. No effect on networks without conv layers or on
    post-training modes (the converter already gives their Dense kernels a scale per unit)."""
    float_head: bool = False
    """qat: leave the output heads (advantage and value) in float: the int8 body's last features
    feed float heads, so the action is chosen on float advantages. Why: a small student's action
    gaps can be below one int8 step of its advantage output (whose range spans the rare states
    where one action is far better), and int8 then ties or flips them; the heads are a few
    hundred weights (4 bytes each). TFLite Micro and the C export run the float heads as well."""
    equalize: bool = False
    """qat with float_head: before QAT, scale each unit feeding the float heads so that all span the
    same range on the calibration states, the heads' weights divided to match (exact in float;
    compress.rewrites.equalize_head_input). Why: the int8 tensor those units share has one range,
    and most units used a few of its steps (MinAtar Space Invaders, docs/minatar.md)."""
    kernel_bits: KernelBits = Field(default_factory=dict)
    """qat: layers whose kernel trains and exports at 2-7 bits instead of 8, e.g. {hidden_0: 4}. The
    kernel keeps one scale per output unit (per_channel_dense on a CNN) and takes the 2^b-1 integers
    -(2^(b-1)-1)..2^(b-1)-1, the same in every unit, stored exactly as INT4 (b <= 4) or INT8
    (compress.low_bit): runtimes play it as any such kernel, and gzip stores each weight in about b
    bits or fewer. Why not clustering for that: a cluster's centroid becomes a different byte under
    each unit's scale, so a clustered kernel with a scale per unit holds many more distinct bytes
    (docs/minatar.md)."""
    qat_teacher: QatTeacher = "baseline"
    """qat: whom the QAT fine-tune distils to: the baseline, or the variant's own float model as QAT
    starts from it (a student's distilled weights). Why float: its fake-quantized copy can match
    its float self exactly, so QAT's steps go to undoing the rounding rather than to chasing what a
    small student cannot reach. On the same MinAtar Breakout float builds it was no better: worse
    on 5 of 7 (docs/minatar.md). Needs fine_tune.method: distill."""
    qat_steps: count_from(1) | None = None
    """Gradient steps of the QAT fine-tune (default: fine_tune.steps)."""
    qat_learning_rate: LearningRate | None = None
    """Adam step size of the QAT fine-tune (default: fine_tune.learning_rate). QAT starts from a
    tuned model: a distillation's step size can undo it."""

    @property
    def is_qat(self) -> bool:
        return self.mode == "qat"

    def _is_set(self, key: str) -> bool:
        return getattr(self, key) != type(self).model_fields[key].get_default(call_default_factory=True)

    @model_validator(mode="after")
    def _post_training_options(self) -> QuantizeConfig:
        # equalize first: it fails only without float_head, where float_head's own check cannot
        if self.equalize and not self.float_head:
            raise ValueError("equalize needs float_head: true (int8 heads would take the inverse scales into their "
                             "weights' ranges); add float_head: true or remove equalize")
        for key, modes in MODE_ONLY.items():
            if self._is_set(key) and self.mode not in modes:
                raise ValueError(mode_only_refusal(key, self.mode))
        if self.input_scaling != "std" and not self.normalize_input:
            raise ValueError("input_scaling scales the normalized input; with normalize_input: false there is none: remove one")
        return self
