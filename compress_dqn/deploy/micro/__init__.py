"""Microcontroller deployment with TensorFlow Lite Micro (TFLM): measured flash and RAM, C++ export.

Figures here are measured with TFLM's own Python interpreter (the `tflite-micro` package), not
estimated: flash is the length of the model array, RAM is the smallest tensor arena with which
TFLM allocates and invokes the model (found by bisection; 64-bit host, reference kernels). A
32-bit target needs somewhat less (its structs hold 4-byte pointers), optimized kernels such as
CMSIS-NN may ask for scratch buffers the reference ones do not, hence the stated margin.

`MicroPolicy` plays episodes through that interpreter with `TFLitePolicy`'s interface, so the
returns a device would get can be checked on the host. On int8 policies its actions equal LiteRT's
builtin kernels bit for bit, not always XNNPACK's (LiteRT's default), which requantizes in float
and can round a small action gap the other way. Nothing here imports TensorFlow.
"""

from compress_dqn.deploy.micro.arena import (
    ARENA_MARGIN, ARENA_MARGIN_MIN, FITS_COUNTS, RAM_BUDGETS, TFLM_RUNTIME_FLASH, ArenaProbe, flash_fits, measure_arena, micro_summary, with_margin,
)
from compress_dqn.deploy.micro.cpp import default_name
from compress_dqn.deploy.micro.model import (
    INSTALL_HINT, RESOLVER_METHODS, ModelInfo, available, inspect_model,
)
from compress_dqn.deploy.micro.play import MicroPolicy
from compress_dqn.deploy.micro.rewrite import LutCompression, int8_io_model, try_compression
from compress_dqn.deploy.micro.uint8_input import uint8_input_model

__all__ = [
    "ARENA_MARGIN", "ARENA_MARGIN_MIN", "FITS_COUNTS", "TFLM_RUNTIME_FLASH", "flash_fits", "INSTALL_HINT", "RAM_BUDGETS", "RESOLVER_METHODS", "ArenaProbe",
    "LutCompression", "MicroPolicy", "ModelInfo", "available", "default_name", "inspect_model",
    "int8_io_model", "measure_arena", "micro_summary", "try_compression", "uint8_input_model", "with_margin",
]
