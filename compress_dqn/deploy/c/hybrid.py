"""The C of LiteRT's hybrid (dynamic-range) kernels: float activations quantized per call, int8 weights, float out.

A dynamic-range file keeps float activations and int8 weights; LiteRT's hybrid FULLY_CONNECTED and
CONV_2D quantize their input on every call, multiply in integers and scale back in float. Widening
the weights and running in float does not take the same action on every state, so each routine
here repeats the kernel's arithmetic, operation by operation:
- the input's quantization: tensor_utils::AsymmetricQuantizeFloats / SymmetricQuantizeFloats,
  which LiteRT's x86-64 (and ARMv7) build runs as NeonAsymmetricQuantizeFloats /
  NeonSymmetricQuantizeFloats through NEON_2_SSE (optimized/neon_tensor_utils.cc): the range's
  bounds capped at zero, the asymmetric scale and zero point in double from the float difference
  rmax - rmin, the first n & ~7 values rounded by RoundToNearest (truncate v +/- 0.5, the sum in
  float), the rest by roundf; aarch64 builds round all of them as roundf (vcvtaq), which can differ
  on a value within a float step of a half;
- FULLY_CONNECTED (fully_connected.cc EvalHybridDense, then MatrixBatchVectorMultiplyAccumulate):
  y = bias + (float)(dot(w, q) - rowsum(w) * zero_point) * scale, scale = filter_scale * input_scale
  (per channel or per tensor), then the activation; an all-zero input gives the bias;
- CONV_2D per channel (conv.cc EvalHybridPerChannel, reference_ops::HybridConvPerChannel): input
  quantized asymmetrically, y = (float)acc * channel_scale * input_scale + bias, clamped; one scale
  for every channel (conv.cc EvalHybrid, optimized_ops::HybridConv): symmetric, y = (float)acc *
  (input_scale * filter_scale) + bias, clamped.
"""

from __future__ import annotations

HYBRID_ROUTINES: dict[str, str] = {
    "round_half_add": """\
/* LiteRT's RoundToNearest where it has no vcvta (x86-64 through NEON_2_SSE, ARMv7): v + 0.5 (v - 0.5 below
   zero), rounded to float, then truncated. */
static int32_t round_half_add(float v) {
  float s = v + (v < 0.0f ? -0.5f : 0.5f);
  if (s >= 2147483648.0f) return INT32_MAX;
  if (s <= -2147483648.0f) return INT32_MIN;
  return (int32_t)s;
}
""",
    "hybrid_quantize": """\
static int32_t round_away_double(double v) {  /* round(): ties away from zero, for |v| < 2^31 */
  int32_t t = (int32_t)v;
  double d = v - (double)t;
  if (d >= 0.5) return t + 1;
  if (d <= -0.5) return t - 1;
  return t;
}

/* A hybrid op's input, quantized per call as LiteRT does (Neon{A}symmetricQuantizeFloats): into q, returning
   the scaling factor, *zero_point the offset (0 when symmetric). */
static float hybrid_quantize(const float *x, int n, int asymmetric, int8_t *q, int32_t *zero_point) {
  int vector_part = n & ~7;  /* LiteRT's loop of 8 rounds these as round_half_add, the rest as roundf */
  float lo, hi;
  *zero_point = 0;
  if (asymmetric) {
    lo = 0.0f;  /* the range always holds zero */
    hi = 0.0f;
    for (int i = 0; i < n; ++i) {
      if (x[i] < lo) lo = x[i];
      if (x[i] > hi) hi = x[i];
    }
    if (lo == hi) {
      for (int i = 0; i < n; ++i) q[i] = 0;
      return 1.0f;
    }
    float width = hi - lo;  /* in float, then widened: as LiteRT's NEON code */
    double scale = (double)width / 255.0;
    double lo_steps = (double)lo / scale, hi_steps = (double)hi / scale;
    double from_min = -128.0 - lo_steps, from_max = 127.0 - hi_steps;
    double error_min = 128.0 + (lo_steps < 0.0 ? -lo_steps : lo_steps);
    double error_max = 127.0 + (hi_steps < 0.0 ? -hi_steps : hi_steps);
    double zero = error_min < error_max ? from_min : from_max;
    int32_t z = zero <= -128.0 ? -128 : (zero >= 127.0 ? 127 : round_away_double(zero));
    float factor = (float)scale;
    float inverse = factor == 0.0f ? 0.0f : 1.0f / factor;
    for (int i = 0; i < n; ++i) {
      float p = x[i] * inverse;
      int32_t v = (i < vector_part ? round_half_add(p) : round_away(p)) + z;
      q[i] = clamp8(v, -128, 127);
    }
    *zero_point = z;
    return factor;
  }
  lo = x[0];
  hi = x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
  }
  lo = lo < 0.0f ? -lo : lo;
  hi = hi < 0.0f ? -hi : hi;
  float range = hi < lo ? lo : hi;
  if (range == 0.0f) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 1.0f;
  }
  float factor = range / 127.0f;
  float inverse = 127.0f / range;
  for (int i = 0; i < n; ++i) {
    float p = x[i] * inverse;
    q[i] = clamp8(i < vector_part ? round_half_add(p) : round_away(p), -127, 127);
  }
  return factor;
}
""",
    "fc_hybrid": """\
/* LiteRT's EvalHybridDense: y = bias + (float)(w . (q - zero_point)) * (filter_scale * input_scale), then the
   activation; q the input quantized per call into xq. */
static void fc_hybrid(const float *x, int n_in, const int8_t *w, const float *bias, int n_out, const float *w_scale,
                      int per_channel, int asymmetric, float lo, float hi, int8_t *xq, float *y) {
  int zero_input = 1;
  for (int i = 0; i < n_in; ++i) if (x[i] != 0.0f) zero_input = 0;
  if (zero_input) {  /* LiteRT skips the product: the bias alone */
    for (int o = 0; o < n_out; ++o) {
      float v = bias ? bias[o] : 0.0f;
      y[o] = v < lo ? lo : (v > hi ? hi : v);
    }
    return;
  }
  int32_t zero_point;
  float factor = hybrid_quantize(x, n_in, asymmetric, xq, &zero_point);
  if (!per_channel) factor = factor * w_scale[0];
  for (int o = 0; o < n_out; ++o) {
    const int8_t *row = w + o * n_in;
    int32_t dot = 0, row_sum = 0;
    for (int i = 0; i < n_in; ++i) {
      dot += (int32_t)row[i] * xq[i];
      row_sum += row[i];
    }
    dot -= row_sum * zero_point;
    float scale = per_channel ? w_scale[o] * factor : factor;
    float p = (float)dot * scale;
    float v = (bias ? bias[o] : 0.0f) + p;
    y[o] = v < lo ? lo : (v > hi ? hi : v);
  }
}
""",
    "conv_hybrid": """\
/* LiteRT's hybrid CONV_2D: per channel (EvalHybridPerChannel, asymmetric input) y = (float)acc * channel_scale
   * input_scale + bias; one filter scale (EvalHybrid, symmetric input) y = (float)acc * (input_scale *
   filter_scale) + bias; both clamped. Padding adds nothing, as the kernels' skipped (or zero-point) taps. */
static void conv_hybrid(const float *x, int ih, int iw, int ic, const int8_t *w, const float *bias,
                        int oc, int kh, int kw, int sh, int sw, int dh, int dw, int ph, int pw, int oh, int ow,
                        const float *w_scale, int per_channel, float lo, float hi, int8_t *xq, float *y) {
  int32_t zero_point;
  float factor = hybrid_quantize(x, ih * iw * ic, per_channel, xq, &zero_point);
  if (!per_channel) factor = factor * w_scale[0];
  for (int oy = 0; oy < oh; ++oy) {
    for (int ox = 0; ox < ow; ++ox) {
      for (int o = 0; o < oc; ++o) {
        int32_t acc = conv_acc_s8(xq, ih, iw, ic, zero_point, w, o, kh, kw, sh, sw, dh, dw, ph, pw, oy, ox);
        float v = (float)acc;
        if (per_channel) {
          v = v * w_scale[o];
          v = v * factor;
        } else {
          v = v * factor;
        }
        if (bias) v = v + bias[o];
        y[(oy * ow + ox) * oc + o] = v < lo ? lo : (v > hi ? hi : v);
      }
    }
  }
}
""",
}

HYBRID_NEEDS: dict[str, list[str]] = {
    "hybrid_quantize": ["round_half_add", "round_away", "clamp8"],
    "fc_hybrid": ["hybrid_quantize"],
    "conv_hybrid": ["hybrid_quantize", "conv_acc_s8"],
}
