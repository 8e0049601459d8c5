"""The records of what a policy costs on a microcontroller, as results.json holds them (evaluation re-exports them):
under TFLite Micro (MicroFigures) and as generated C with no runtime (CFigures).

They live below evaluation so that deploy.micro's micro_summary and deploy.c.measure's c_summary
return them typed, and outside those modules so that reading results.json imports neither TFLM's
tooling nor the C export; MicroFigures' JSON is what runs wrote before the record existed: keys a
writer never set (a run without TFLite Micro installed writes only runs, reason and flash_bytes) are
left out, and a reader ignores keys a later release adds.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)


class FlashEstimate(BaseModel):
    """TFLite Micro's own code in flash, as its docs state it."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    low_bytes: int
    high_bytes: int
    source: str


TFLM_RUNTIME_FLASH = FlashEstimate(
    low_bytes=9732, high_bytes=22 * 1024,
    source="low: TFLM's framework alone (interpreter, memory planner; no kernel), 9,732 B of text on a Cortex-M3 "
           "(STM32F103 'bluepill'), TFLM's memory_footprint README (github.com/tensorflow/tflite-micro, "
           "tensorflow/lite/micro/examples/memory_footprint/README.md); high: 22 KB 'with enough operators to run "
           "a speech keyword detection model' on a Cortex M3, TFLM's original README (16 KB 'core runtime')",
)
"""TFLM's own code in flash, which the model array does not count: figures TFLM publishes, not measured
here. The low one has no kernel at all (a policy needs FULLY_CONNECTED, QUANTIZE, ARG_MAX, ...); the high
one has a keyword model's kernels. `export --target c` measures a policy's whole image instead."""


class MicroFigures(BaseModel):
    """What a policy costs on a microcontroller (micro_summary), or why it was not measured: without
    TFLite Micro installed only runs (None), reason and flash_bytes are written."""

    model_config = ConfigDict(extra="ignore")
    omit_unset: ClassVar[frozenset[str]] = frozenset(
        {"arena_bytes", "arena_bytes_with_margin", "ops", "runtime_flash_estimate", "fits", "fits_flash", "fits_counts"})
    runs: bool | None
    arena_bytes: int | None = None
    arena_bytes_with_margin: int | None = None
    flash_bytes: int
    ops: list[str] = Field(default_factory=list)
    reason: str | None = None
    runtime_flash_estimate: FlashEstimate | None = None
    fits: dict[str, bool] = Field(default_factory=dict)
    """Whether the arena with margin fits each RAM budget (by name, e.g. 32KB)."""
    fits_flash: dict[str, bool] = Field(default_factory=dict)
    """Whether the model array plus the runtime's high estimate fits flash of each budget's size."""
    fits_counts: str | None = None

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> object:
        data = handler(self)
        if isinstance(data, dict):
            for name in self.omit_unset - self.model_fields_set:
                data.pop(name, None)
        return data

    def to_dict(self) -> dict:
        """The record as results.json holds it."""
        return self.model_dump(mode="json")


M0PLUS = "cortex-m0plus"
M4F = "cortex-m4f"
C_TARGETS = (M0PLUS, M4F)
"""The parts the C policy's image is built for (deploy/c/measure.py), by their key in CFigures."""


class CFigures(BaseModel):
    """What the policy costs as generated C with no runtime (`export --target c`, c_measure.c_summary):
    flash and RAM of a minimal Cortex-M image per target, measured by cross-compiling; or why there are none."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    translated: bool
    """Whether the C export translates the policy (reason says why not)."""
    reason: str | None = None
    """Why flash and RAM are missing: the policy does not translate, or its image did not build."""
    integer_only: bool | None = None
    """No floating point after the input's quantization (an int8 policy); None where it did not translate."""
    form: str | None = None
    """How the C stores its int8 weights: dense, sparse, packed (int4 two a byte) or sparse+packed (deploy/c/packed.py);
    None where it did not translate, and in records written before the C export compressed weights."""
    flash_bytes: dict[str, int] | None = None
    """By target (C_TARGETS): text + rodata + data of the image."""
    ram_bytes: dict[str, int] | None = None
    """By target: data + bss + stack of the image."""
    counts: str
    """What flash and RAM count, in one sentence."""

    def on(self, target: str) -> tuple[int, int] | None:
        """(flash, RAM) bytes on `target`, or None where they were not measured."""
        if self.flash_bytes is None or self.ram_bytes is None or target not in self.flash_bytes:
            return None
        return self.flash_bytes[target], self.ram_bytes[target]

    def to_dict(self) -> dict:
        """The record as results.json holds it."""
        return self.model_dump(mode="json")
