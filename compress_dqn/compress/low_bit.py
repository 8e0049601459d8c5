"""Kernels at 2-7 bits in quantization-aware training, stored exactly in a TFLite file.

The TFLite converter stores a weight FakeQuant of 4 bits or fewer as INT4 with a scale of range/7,
and one of 5-8 bits as INT8 with a scale of range/127. tfmot's n-bit quantizers give a b-bit kernel
a range of its largest weight, so under 4 bits the converter re-rounds the trained values onto its
own grid (3 bits: k/3 of the range becomes round(7k/3)/7). Here a b-bit kernel instead trains at
the storage's bit width with its range stretched so that one step is the b-bit step: its weights
take the 2^b-1 values -(2^(b-1)-1)..2^(b-1)-1 times that step, which the file stores unchanged.
Every runtime that plays INT4/INT8 kernels plays it; fewer values gzip to fewer bits a weight.
"""

from __future__ import annotations

from compress_dqn._tf import tf
from tensorflow_model_optimization.python.core.quantization.keras import quantizers
from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import default_8bit_quantize_registry


def storage_bits(bits: int) -> int:
    """The bit width a TFLite file stores a `bits`-bit kernel in: INT4 up to 4, else INT8."""
    return 4 if bits <= 4 else 8


def levels(bits: int) -> int:
    """The largest magnitude a symmetric, narrow-range `bits`-bit integer takes (4 bits: 7)."""
    return 2 ** (bits - 1) - 1


class GridKernelQuantizer(quantizers.LastValueQuantizer):
    """A kernel's last-value, symmetric fake quantization at `bits`, computed at its storage width."""

    def __init__(self, bits: int, per_axis: bool) -> None:
        super().__init__(num_bits=storage_bits(bits), per_axis=per_axis, symmetric=True, narrow_range=True)
        self.bits = bits

    # build: tfmot's own (a range per output channel where per_axis, else one).

    def __call__(self, inputs: tf.Tensor, training: bool, weights: dict[str, tf.Variable], **kwargs) -> tf.Tensor:
        if training:  # the range follows the kernel, as tfmot's last-value quantizer's does
            axes = list(range(inputs.shape.rank - 1)) if self.per_axis else None
            top = tf.reduce_max(tf.abs(inputs), axis=axes) * (levels(self.num_bits) / levels(self.bits))
            top = tf.maximum(top, 1e-8)
            weights["min_var"].assign(-top)
            weights["max_var"].assign(top)
        fake_quant = (tf.quantization.fake_quant_with_min_max_vars_per_channel if self.per_axis
                      else tf.quantization.fake_quant_with_min_max_vars)
        return fake_quant(inputs, weights["min_var"], weights["max_var"], num_bits=self.num_bits, narrow_range=True)

    def get_config(self) -> dict[str, int | bool]:
        return {"bits": self.bits, "per_axis": self.per_axis}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GridKernelQuantizer) and self.get_config() == other.get_config()


class LowBitKernelConfig(default_8bit_quantize_registry.Default8BitQuantizeConfig):
    """tfmot's 8-bit config for a Dense or Conv2D layer (8-bit output), its kernel at `bits`: a scale
    per output channel for a Conv2D (a Dense computed as one, quantize.per_channel_dense), one for a Dense."""

    def __init__(self, bits: int, per_axis: bool) -> None:
        super().__init__(["kernel"], ["activation"], False)
        self.bits, self.per_axis = bits, per_axis
        self.weight_quantizer = GridKernelQuantizer(bits, per_axis)

    def get_config(self) -> dict[str, int | bool]:
        return {"bits": self.bits, "per_axis": self.per_axis}


SCOPE = {"LowBitKernelConfig": LowBitKernelConfig, "GridKernelQuantizer": GridKernelQuantizer}
"""What tfmot needs in quantize_scope to clone a model holding these."""
