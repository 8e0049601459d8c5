"""The C helper routines a generated policy calls, each one a copy of a LiteRT reference kernel's arithmetic.

Why a copy and not "about the same": an int8 policy's action can turn on one rounding step, so the C
must round where LiteRT's reference kernels (`OpResolverType.BUILTIN_REF`) round:
- FULLY_CONNECTED (int8): `round((double)acc * M)`, M = input_scale * filter_scale / output_scale in
  double (LiteRT's reference_integer_ops::FullyConnected with scales). `fc_scale` computes it in
  integers: acc * M's 53-bit significand exactly, rounded to 53 bits (ties to even, as the double
  product is), then to an integer (ties away from zero, as round()). No floating point.
- CONV_2D (int8): gemmlowp's fixed point, MultiplyByQuantizedMultiplier (SaturatingRoundingDoublingHighMul,
  then RoundingDivideByPOT), multipliers from QuantizeMultiplier.
- QUANTIZE: roundf(x / scale) + zero_point, clamped; float ops in float, one operation a statement
  (FP_CONTRACT off: a fused multiply-add would round once where LiteRT rounds twice).
- the hybrid (dynamic-range) FULLY_CONNECTED and CONV_2D: hybrid.py; the kernels of sparse and int4
  weights: packed_kernels.py.
Only the routines a policy uses are emitted (`routines`).
"""

from __future__ import annotations

from compress_dqn.deploy.c.hybrid import HYBRID_NEEDS, HYBRID_ROUTINES
from compress_dqn.deploy.c.packed_kernels import PACKED_NEEDS, PACKED_ROUTINES

ROUTINES: dict[str, str] = {
    "round_away": """\
/* roundf(): to nearest, ties away from zero, without libm. v - trunc(v) is exact in float. */
static int32_t round_away(float v) {
  if (v > 2.0e9f) return INT32_MAX;
  if (v < -2.0e9f) return INT32_MIN;
  float t = (float)(int32_t)v;
  float d = v - t;
  if (d >= 0.5f) return (int32_t)t + 1;
  if (d <= -0.5f) return (int32_t)t - 1;
  return (int32_t)t;
}
""",
    "round_even": """\
/* numpy's round(): to nearest, ties to even (the caller's quantization of an int8-input policy). */
static int32_t round_even(float v) {
  if (v > 2.0e9f) return INT32_MAX;
  if (v < -2.0e9f) return INT32_MIN;
  int32_t t = (int32_t)v;
  float d = v - (float)t;
  if (d > 0.5f || (d == 0.5f && (t & 1))) return t + 1;
  if (d < -0.5f || (d == -0.5f && (t & 1))) return t - 1;
  return t;
}
""",
    "clamp8": """\
static int8_t clamp8(int32_t v, int32_t lo, int32_t hi) {
  return (int8_t)(v < lo ? lo : (v > hi ? hi : v));
}
""",
    "fc_scale": """\
static int bits64(uint64_t v) {
#if defined(__GNUC__) || defined(__clang__)
  return v ? 64 - __builtin_clzll(v) : 0;
#else
  int n = 0;
  while (v) { ++n; v >>= 1; }
  return n;
#endif
}

/* round(fl53(acc * m * 2^-s)): what LiteRT's reference FULLY_CONNECTED computes in double, in integers. */
static int32_t fc_scale(int32_t acc, uint64_t m, int s) {
  uint32_t a = acc < 0 ? 0u - (uint32_t)acc : (uint32_t)acc;
#if UINTPTR_MAX > 0xffffffffu && !defined(POLICY_PORTABLE_FC_SCALE)
  {  /* 64-bit hosts, the same integers faster: q = floor(acc * m / 2^21); the 53-bit rounding of the
        product moves it by at most 2^(drop - 22), which matters only that close to a tie */
    uint64_t q = (uint64_t)a * (uint32_t)(m >> 21) + (((uint64_t)a * (uint32_t)(m & 0x1fffff)) >> 21);
    int sh = s - 21;
    if (q && sh > 1 && sh < 63) {
      int over = bits64(q) + 21 - 53 - 22;
      uint64_t margin = (over > 0 ? (uint64_t)1 << over : 0) + 1, t = q + ((uint64_t)1 << (sh - 1));
      uint64_t r = t & (((uint64_t)1 << sh) - 1);
      if (r >= margin && r < ((uint64_t)1 << sh) - margin) {
        uint64_t y = t >> sh;
        if (y > 0x7fffffffu) y = 0x7fffffffu;
        return acc < 0 ? -(int32_t)y : (int32_t)y;
      }
    }
  }
#endif
  uint64_t lo = (uint64_t)a * (uint32_t)m;
  uint64_t mid = (uint64_t)a * (uint32_t)(m >> 32);
  uint64_t low = lo + (mid << 32);
  uint64_t high = (mid >> 32) + (low < lo);
  int drop = (high ? 64 + bits64(high) : bits64(low)) - 53;
  uint64_t keep = low;
  if (drop > 0) {  /* the double product keeps 53 bits: round the rest off, ties to even */
    uint64_t rest = low & (((uint64_t)1 << drop) - 1), half = (uint64_t)1 << (drop - 1);
    keep = (low >> drop) | (high << (64 - drop));
    if (rest > half || (rest == half && (keep & 1))) ++keep;
  } else {
    drop = 0;
  }
  int shift = s - drop;
  uint64_t y;
  if (shift <= 0) y = keep << -shift;
  else if (shift > 60) y = 0;
  else y = (keep + ((uint64_t)1 << (shift - 1))) >> shift;  /* ties away from zero, as round() */
  if (y > 0x7fffffffu) y = 0x7fffffffu;
  return acc < 0 ? -(int32_t)y : (int32_t)y;
}
""",
    "mbqm": """\
/* gemmlowp's SaturatingRoundingDoublingHighMul then RoundingDivideByPOT (TFLite's MultiplyByQuantizedMultiplier). */
static int32_t mbqm(int32_t x, int32_t multiplier, int shift) {
  int left = shift > 0 ? shift : 0, right = shift > 0 ? 0 : -shift;
  int32_t a = (int32_t)((uint32_t)x << left);
  int32_t high;
  if (a == INT32_MIN && multiplier == INT32_MIN) {
    high = INT32_MAX;
  } else {
    int64_t ab = (int64_t)a * multiplier;
    int64_t v = ab + (ab >= 0 ? ((int64_t)1 << 30) : (1 - ((int64_t)1 << 30)));
    high = (int32_t)(v >= 0 ? v >> 31 : -((-v) >> 31));  /* division truncating toward zero */
  }
  int32_t mask = (int32_t)(((uint32_t)1 << right) - 1);
  int32_t rem = high & mask, threshold = (mask >> 1) + (high < 0 ? 1 : 0);
  return (high >> right) + (rem > threshold ? 1 : 0);
}
""",
    "fc_s8": """\
static void fc_s8(const int8_t *x, int n_in, int32_t x_zero, const int8_t *w, const int32_t *bias,
                  const int16_t *bias16, int n_out,
                  const uint64_t *m, const uint8_t *s, int per_channel, int32_t y_zero, int32_t lo, int32_t hi,
                  int8_t *y) {
  for (int o = 0; o < n_out; ++o) {
    const int8_t *row = w + o * n_in;
    int32_t acc = bias ? bias[o] : (bias16 ? bias16[o] : 0);  /* int16 where every bias fits: less flash */
    for (int i = 0; i < n_in; ++i) acc += (int32_t)row[i] * ((int32_t)x[i] - x_zero);
    int c = per_channel ? o : 0;
    y[o] = clamp8(fc_scale(acc, m[c], s[c]) + y_zero, lo, hi);
  }
}
""",
    "conv_s8": """\
static void conv_s8(const int8_t *x, int ih, int iw, int ic, int32_t x_zero, const int8_t *w, const int32_t *bias,
                    int oc, int kh, int kw, int sh, int sw, int dh, int dw, int ph, int pw, int oh, int ow,
                    const int32_t *mult, const int8_t *shift, int32_t y_zero, int32_t lo, int32_t hi, int8_t *y) {
  for (int oy = 0; oy < oh; ++oy) {
    for (int ox = 0; ox < ow; ++ox) {
      for (int o = 0; o < oc; ++o) {
        int32_t acc = conv_acc_s8(x, ih, iw, ic, x_zero, w, o, kh, kw, sh, sw, dh, dw, ph, pw, oy, ox);
        if (bias) acc += bias[o];
        y[(oy * ow + ox) * oc + o] = clamp8(mbqm(acc, mult[o], shift[o]) + y_zero, lo, hi);
      }
    }
  }
}
""",
    "fc_f32": """\
static void fc_f32(const float *x, int n_in, const float *w, const float *bias, int n_out, float lo, float hi,
                   float *y) {
  for (int o = 0; o < n_out; ++o) {
    const float *row = w + o * n_in;
    float total = 0.0f;
    for (int i = 0; i < n_in; ++i) {
      float p = x[i] * row[i];
      total += p;
    }
    float v = total + (bias ? bias[o] : 0.0f);
    y[o] = v < lo ? lo : (v > hi ? hi : v);
  }
}
""",
    "conv_f32": """\
static void conv_f32(const float *x, int ih, int iw, int ic, const float *w, const float *bias,
                     int oc, int kh, int kw, int sh, int sw, int dh, int dw, int ph, int pw, int oh, int ow,
                     float lo, float hi, float *y) {
  for (int oy = 0; oy < oh; ++oy) {
    for (int ox = 0; ox < ow; ++ox) {
      for (int o = 0; o < oc; ++o) {
        float v = conv_acc_f32(x, ih, iw, ic, 0, w, o, kh, kw, sh, sw, dh, dw, ph, pw, oy, ox) + (bias ? bias[o] : 0.0f);
        y[(oy * ow + ox) * oc + o] = v < lo ? lo : (v > hi ? hi : v);
      }
    }
  }
}
""",
    "argmax_s8": """\
static int argmax_s8(const int8_t *v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) if (v[i] > v[best]) best = i;  /* the first of equal maxima, as ARG_MAX */
  return best;
}
""",
    "argmax_f32": """\
static int argmax_f32(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) if (v[i] > v[best]) best = i;  /* the first of equal maxima, as ARG_MAX */
  return best;
}
""",
}

_CONV_ACC = """\
/* One output of a{kind} convolution before its bias: filter o's taps at (oy, ox) times the input{less};
   taps in the padding add nothing (the reference kernels skip them). */
static {acc} conv_acc_{suffix}(const {t} *x, int ih, int iw, int ic, int32_t x_zero, const {t} *w, int o,
                           int kh, int kw, int sh, int sw, int dh, int dw, int ph, int pw, int oy, int ox) {{
  {acc} total = 0;{unused}
  for (int fy = 0; fy < kh; ++fy) {{
    int iy = oy * sh - ph + dh * fy;
    if (iy < 0 || iy >= ih) continue;
    for (int fx = 0; fx < kw; ++fx) {{
      int ix = ox * sw - pw + dw * fx;
      if (ix < 0 || ix >= iw) continue;
      const {t} *px = x + (iy * iw + ix) * ic;
      const {t} *pf = w + ((o * kh + fy) * kw + fx) * ic;
      for (int c = 0; c < ic; ++c) {{
        {product}
      }}
    }}
  }}
  return total;
}}
"""
"""The int8 and float convolutions' accumulation, one loop: the float one rounds each product to
float before adding it (`p`), as the reference kernel's float code does (no fused multiply-add)."""
ROUTINES["conv_acc_s8"] = _CONV_ACC.format(kind="n int8", less=" less its zero point", acc="int32_t", suffix="s8",
                                           t="int8_t", unused="", product="total += (int32_t)pf[c] * ((int32_t)px[c] - x_zero);")
ROUTINES["conv_acc_f32"] = _CONV_ACC.format(kind=" float", less=" (x_zero: 0, unused)", acc="float", suffix="f32", t="float", unused="\n  (void)x_zero;",
                                            product="float p = px[c] * pf[c];\n        total += p;")
ROUTINES.update(HYBRID_ROUTINES)
ROUTINES.update(PACKED_ROUTINES)

_NEEDS = {"fc_s8": ["clamp8", "fc_scale"], "conv_s8": ["conv_acc_s8", "clamp8", "mbqm"], "conv_f32": ["conv_acc_f32"],
          **HYBRID_NEEDS, **PACKED_NEEDS}


def routines(used: set[str]) -> str:
    """The C text of the used routines and those they call, each once, callees first."""
    order: list[str] = []

    def add(name: str) -> None:
        for dep in _NEEDS.get(name, []):
            add(dep)
        if name not in order:
            order.append(name)

    for name in sorted(used):
        add(name)
    return "\n".join(ROUTINES[name] for name in order)
