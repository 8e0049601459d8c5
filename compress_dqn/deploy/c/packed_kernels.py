"""The C kernels that read compressed int8 weights where they lie (packed.py says the forms and why they are exact).

Each is its dense twin (runtime.py's fc_s8 and conv_s8, hybrid.py's fc_hybrid) with the weight
row's sum read from the compressed form: the same integer, then the same requantization or float
scaling, in the same order. conv1_s8_* is conv_s8 for a convolution with one output pixel that
covers its whole input (packed.as_rows; QAT writes the layer after the flatten so), whose output o
is row o's sum plus its bias.
"""

from __future__ import annotations

_READERS = {
    "sparse_dot": """\
/* Sparse rows: row o holds its nonzero weights in column order; count_o entries, each a column step (the first
   from column 0; steps over 255 through fill entries of weight 0) and a weight. Bytes only: no unaligned loads. */
static int sparse_count(const uint8_t *counts, int wide, int o) {
  return wide ? (int)counts[2 * o] | (int)counts[2 * o + 1] << 8 : (int)counts[o];
}

/* The sum of w * (x - x_zero) over one row's entries: the dense row's sum, its zero weights adding nothing. */
static int32_t sparse_dot(const int8_t *x, int32_t x_zero, const uint8_t *step, const int8_t *w, int n) {
  int32_t total = 0;
  int col = 0;
  for (int k = 0; k < n; ++k) {
    col += step[k];
    total += (int32_t)w[k] * ((int32_t)x[col] - x_zero);
  }
  return total;
}
""",
    "int4_dot": """\
/* Int4 weights two a byte, the first in the low nibble (TFLite's layout), rows back to back: the sum of
   w * (x - x_zero) over the n weights from index first, each unpacked and sign-extended in the loop. */
static int32_t int4_dot(const int8_t *x, int32_t x_zero, const uint8_t *w4, int32_t first, int n) {
  int32_t total = 0;
  int32_t j = first;
  int i = 0;
  if (n > 0 && (j & 1)) {  /* a row that starts in a high nibble */
    total += (((int32_t)(w4[j >> 1] >> 4) ^ 8) - 8) * ((int32_t)x[0] - x_zero);
    ++j;
    ++i;
  }
  for (; i + 1 < n; i += 2, j += 2) {
    int32_t b = w4[j >> 1];
    total += (((b & 15) ^ 8) - 8) * ((int32_t)x[i] - x_zero);
    total += (((b >> 4) ^ 8) - 8) * ((int32_t)x[i + 1] - x_zero);
  }
  if (i < n) total += (((int32_t)(w4[j >> 1] & 15) ^ 8) - 8) * ((int32_t)x[i] - x_zero);
  return total;
}
""",
}

_FORMS = {
    "sparse": {"params": "const uint8_t *counts, int wide, const uint8_t *step, const int8_t *w",
               "start": "(void)n_in;", "row": "int n = sparse_count(counts, wide, o);",
               "dot": "sparse_dot({x}, {zero}, step, w, n)", "next": "step += n;\n    w += n;", "reader": "sparse_dot"},
    "int4": {"params": "const uint8_t *w4", "start": "", "row": "",
             "dot": "int4_dot({x}, {zero}, w4, (int32_t)o * n_in, n_in)", "next": "", "reader": "int4_dot"},
}

_FC_S8 = """\
static void fc_s8_{form}(const int8_t *x, int n_in, int32_t x_zero, {params}, const int32_t *bias,
                        const int16_t *bias16, int n_out, const uint64_t *m, const uint8_t *s, int per_channel,
                        int32_t y_zero, int32_t lo, int32_t hi, int8_t *y) {{
  {start}
  for (int o = 0; o < n_out; ++o) {{
    {row}
    int32_t acc = bias ? bias[o] : (bias16 ? bias16[o] : 0);
    acc += {dot_x};
    {next}
    int c = per_channel ? o : 0;
    y[o] = clamp8(fc_scale(acc, m[c], s[c]) + y_zero, lo, hi);
  }}
}}
"""

_CONV1_S8 = """\
static void conv1_s8_{form}(const int8_t *x, int n_in, int32_t x_zero, {params}, const int32_t *bias, int n_out,
                           const int32_t *mult, const int8_t *shift, int32_t y_zero, int32_t lo, int32_t hi, int8_t *y) {{
  {start}
  for (int o = 0; o < n_out; ++o) {{
    {row}
    int32_t acc = {dot_x};
    {next}
    if (bias) acc += bias[o];
    y[o] = clamp8(mbqm(acc, mult[o], shift[o]) + y_zero, lo, hi);
  }}
}}
"""

_FC_HYBRID = """\
static void fc_hybrid_{form}(const float *x, int n_in, {params}, const float *bias, int n_out, const float *w_scale,
                            int per_channel, int asymmetric, float lo, float hi, int8_t *xq, float *y) {{
  {start}
  int zero_input = 1;
  for (int i = 0; i < n_in; ++i) if (x[i] != 0.0f) zero_input = 0;
  if (zero_input) {{  /* LiteRT skips the product: the bias alone */
    for (int o = 0; o < n_out; ++o) {{
      float v = bias ? bias[o] : 0.0f;
      y[o] = v < lo ? lo : (v > hi ? hi : v);
    }}
    return;
  }}
  int32_t zero_point;
  float factor = hybrid_quantize(x, n_in, asymmetric, xq, &zero_point);
  if (!per_channel) factor = factor * w_scale[0];
  for (int o = 0; o < n_out; ++o) {{
    {row}
    int32_t dot = {dot_q};  /* dot(w, q) - rowsum(w) * zero_point, as one sum */
    {next}
    float scale = per_channel ? w_scale[o] * factor : factor;
    float p = (float)dot * scale;
    float v = (bias ? bias[o] : 0.0f) + p;
    y[o] = v < lo ? lo : (v > hi ? hi : v);
  }}
}}
"""

_KERNELS = {"fc_s8": (_FC_S8, ["clamp8", "fc_scale"]), "conv1_s8": (_CONV1_S8, ["clamp8", "mbqm"]),
            "fc_hybrid": (_FC_HYBRID, ["hybrid_quantize"])}


def _kernel(template: str, form: str) -> str:
    f = _FORMS[form]
    text = template.format(form=form, params=f["params"], start=f["start"], row=f["row"], next=f["next"],
                           dot_x=f["dot"].format(x="x", zero="x_zero"), dot_q=f["dot"].format(x="xq", zero="zero_point"))
    return "\n".join(line for line in text.splitlines() if line.strip()) + "\n"  # an empty slot leaves no blank line


PACKED_ROUTINES: dict[str, str] = dict(_READERS)
PACKED_NEEDS: dict[str, list[str]] = {}
for _name, (_template, _needs) in _KERNELS.items():
    for _form in _FORMS:
        PACKED_ROUTINES[f"{_name}_{_form}"] = _kernel(_template, _form)
        PACKED_NEEDS[f"{_name}_{_form}"] = [*_needs, _FORMS[_form]["reader"]]
