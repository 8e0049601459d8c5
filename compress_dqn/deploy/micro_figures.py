"""The record of what a policy costs on TFLite Micro, as results.json holds it (evaluation re-exports it).

It lives below evaluation so that deploy.micro's micro_summary returns it typed, and outside the
micro package so that reading results.json does not import TFLM's tooling; its JSON is what runs
wrote before the record existed: keys a writer never set (a run without TFLite Micro installed
writes only runs, reason and flash_bytes) are left out, and a reader ignores keys a later release adds.
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
