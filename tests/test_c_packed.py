"""Compressed weights in the C export (deploy/c/packed.py): a pruned layer as sparse rows, an INT4 kernel two a byte.

The compressed C takes the dense C's action and computes its argmax input bit for bit, and both
are LiteRT's reference kernels'; a policy with nothing to gain keeps its C byte for byte; an
outsider's gcc + ctypes client plays the run's returns with the sparse C.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _decoded(counts: np.ndarray, wide: int, steps: np.ndarray, weights: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The matrix the sparse streams describe, read as the C reads them."""
    rows, k = np.zeros(shape, np.int64), 0
    for o in range(shape[0]):
        n = int(counts[2 * o]) | int(counts[2 * o + 1]) << 8 if wide else int(counts[o])
        col = 0
        for _ in range(n):
            col += int(steps[k])
            rows[o, col] += int(weights[k])
            k += 1
    assert k == steps.size == weights.size
    return rows


def test_sparse_streams_and_int4_packing_hold_the_matrix_exactly():
    from compress_dqn.deploy.c.packed import INT4, SPARSE, choose, pack_int4, sparse_streams
    from compress_dqn.deploy.tflite.graph import Tensor, _unpacked_int4

    rng = np.random.default_rng(0)
    rows = (rng.integers(-127, 128, (6, 1100)) * (rng.random((6, 1100)) < 0.05)).astype(np.int8)
    rows[1] = 0
    rows[2, 1099] = 5  # a row whose only weight lies 1,099 columns on: fill entries
    rows[3, :300] = 7  # 300 entries: counts two bytes each
    counts, wide, steps, weights = sparse_streams(rows)
    assert wide == 1 and counts.size == 12 and np.array_equal(_decoded(counts, wide, steps, weights, rows.shape), rows)
    narrow = rows[[0, 1, 2, 4]]
    assert sparse_streams(narrow)[1] == 0 and np.array_equal(_decoded(*sparse_streams(narrow), narrow.shape), narrow)
    odd = rng.integers(-8, 8, (5, 7)).astype(np.int8)  # 35 weights: rows start in high nibbles, a half byte left over
    assert np.array_equal(_unpacked_int4(pack_int4(odd).tobytes(), odd.size).reshape(odd.shape), odd)

    def tensor(values: np.ndarray, int4: bool = False) -> Tensor:
        return Tensor(0, values.shape, values.dtype, np.ones(1, np.float32), np.zeros(1, np.int64), 0, values, int4=int4)

    dense = rng.integers(-127, 128, (64, 64)).astype(np.int8)
    assert choose(tensor(dense), dense) == ""  # nothing to gain: dense, as before
    assert choose(tensor(rows), rows) == SPARSE
    small = rows[:, :100]  # sparse, but saves less than a kernel's code
    assert choose(tensor(small), small) == ""
    four = rng.integers(-8, 8, (64, 64)).astype(np.int8)
    assert choose(tensor(four, int4=True), four) == INT4 and choose(tensor(four), four) == ""


def test_the_compressed_kernels_sum_as_the_dense_ones(tmp_path):
    """fc_s8, conv_s8 (one output pixel) and fc_hybrid against their sparse and int4 twins, in C, on matrices that
    meet every edge of the forms: fill entries, two-byte counts, empty rows, odd row lengths, zero points."""
    from compress_dqn.deploy.c.source import CPolicy
    from compress_dqn.deploy.c.measure import compile_shared
    from compress_dqn.deploy.c.packed import pack_int4, sparse_streams
    from compress_dqn.deploy.c.runtime import routines

    rng = np.random.default_rng(1)
    n_out, n_in = 9, 1101
    sparse = (rng.integers(-127, 128, (n_out, n_in)) * (rng.random((n_out, n_in)) < 0.1)).astype(np.int8)
    sparse[1], sparse[2, :] = 0, 0
    sparse[2, 1100], sparse[3, :400] = -9, 100
    four = rng.integers(-8, 8, (n_out, n_in)).astype(np.int8)

    def arr(values) -> str:
        return f"{{{', '.join(str(int(v)) for v in np.ravel(values))}}}"

    counts, wide, steps, values = sparse_streams(sparse)
    c = ['#include "k.h"', "#include <float.h>", "#include <stdint.h>",
         routines({"fc_s8", "fc_s8_sparse", "fc_s8_int4", "conv_s8", "conv1_s8_sparse", "conv1_s8_int4", "fc_hybrid",
                   "fc_hybrid_sparse", "fc_hybrid_int4"}),
         f"static const int8_t ws[] = {arr(sparse)};", f"static const int8_t w4[] = {arr(four)};",
         f"static const uint8_t cn[] = {arr(counts)};", f"static const uint8_t st[] = {arr(steps)};",
         f"static const int8_t va[] = {arr(values)};", f"static const uint8_t p4[] = {arr(pack_int4(four))};",
         f"static const int32_t bias[{n_out}] = {arr(rng.integers(-5000, 5000, n_out))};",
         f"static const float fbias[{n_out}] = {{{', '.join(f'{v:.3f}f' for v in rng.normal(0, 1, n_out))}}};",
         f"static const float scale[{n_out}] = {{{', '.join(f'{v:.6f}f' for v in rng.uniform(1e-3, 1e-2, n_out))}}};",
         f"static const uint64_t m[{n_out}] = {arr(rng.integers(1 << 52, 1 << 53, n_out))};",
         f"static const uint8_t s[{n_out}] = {arr(np.full(n_out, 63))};",
         f"static const int32_t mult[{n_out}] = {arr(rng.integers(1 << 30, 1 << 31, n_out))};",
         f"static const int8_t shift[{n_out}] = {arr(np.full(n_out, -10))};",
         "int k_act(const float *o) { return (int)o[0]; }",
         f"""void k_run(const int8_t *x, const float *xf, int32_t zero, int8_t *y, float *yf) {{
  int8_t q[{n_in}];
  fc_s8(x, {n_in}, zero, ws, bias, 0, {n_out}, m, s, 1, 3, -128, 127, y);
  fc_s8_sparse(x, {n_in}, zero, cn, {wide}, st, va, bias, 0, {n_out}, m, s, 1, 3, -128, 127, y + {n_out});
  fc_s8(x, {n_in}, zero, w4, bias, 0, {n_out}, m, s, 1, 3, -128, 127, y + {2 * n_out});
  fc_s8_int4(x, {n_in}, zero, p4, bias, 0, {n_out}, m, s, 1, 3, -128, 127, y + {3 * n_out});
  conv_s8(x, 1, {n_in}, 1, zero, ws, bias, {n_out}, 1, {n_in}, 1, 1, 1, 1, 0, 0, 1, 1, mult, shift, -2, -128, 127, y + {4 * n_out});
  conv1_s8_sparse(x, {n_in}, zero, cn, {wide}, st, va, bias, {n_out}, mult, shift, -2, -128, 127, y + {5 * n_out});
  conv_s8(x, 1, {n_in}, 1, zero, w4, bias, {n_out}, 1, {n_in}, 1, 1, 1, 1, 0, 0, 1, 1, mult, shift, -2, -128, 127, y + {6 * n_out});
  conv1_s8_int4(x, {n_in}, zero, p4, bias, {n_out}, mult, shift, -2, -128, 127, y + {7 * n_out});
  fc_hybrid(xf, {n_in}, ws, fbias, {n_out}, scale, 1, 1, -FLT_MAX, FLT_MAX, q, yf);
  fc_hybrid_sparse(xf, {n_in}, cn, {wide}, st, va, fbias, {n_out}, scale, 1, 1, -FLT_MAX, FLT_MAX, q, yf + {n_out});
  fc_hybrid(xf, {n_in}, w4, fbias, {n_out}, scale, 0, 0, -FLT_MAX, FLT_MAX, q, yf + {2 * n_out});
  fc_hybrid_int4(xf, {n_in}, p4, fbias, {n_out}, scale, 0, 0, -FLT_MAX, FLT_MAX, q, yf + {3 * n_out});
}}"""]
    header = "#include <stdint.h>\n#define K_OBS_SIZE 1\nint k_act(const float *o);\n"
    lib = compile_shared(CPolicy("k", "\n".join(c), header, "float", 1, 1, True, 0), tmp_path)
    lib.k_run.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int32] + [ctypes.c_void_p] * 2
    for zero in (-128, 0, 37):
        x = rng.integers(-128, 128, n_in).astype(np.int8)
        xf = (rng.normal(0, 1, n_in) * (rng.random(n_in) < 0.7)).astype(np.float32)
        y, yf = np.zeros(8 * n_out, np.int8), np.zeros(4 * n_out, np.float32)
        lib.k_run(x.ctypes.data, xf.ctypes.data, zero, y.ctypes.data, yf.ctypes.data)
        y, yf = y.reshape(8, n_out), yf.reshape(4, n_out).view(np.int32)
        for dense, compressed in ((0, 1), (2, 3), (4, 5), (6, 7)):
            assert np.array_equal(y[dense], y[compressed]), (zero, dense)
        assert np.array_equal(yf[0], yf[1]) and np.array_equal(yf[2], yf[3]), zero
        assert len(set(y[0].tolist())) > 3 and len(set(y[4].tolist())) > 3  # not all clamped to one value


def _rewritten(path: Path, out: Path, kind: str, mode: str) -> Path:
    """A copy of the policy file with its largest `kind` op's int8 weights pruned to 90% zeros (mode "prune") or
    turned into an INT4 kernel of the weights / 18 (mode "int4"), as compress-dqn's pruning and kernel_bits write them."""
    from ai_edge_litert import schema_py_generated as schema

    from compress_dqn.deploy.tflite.reader import pack as pack_model

    model = schema.ModelT.InitFromPackedBuf(bytearray(path.read_bytes()), 0)
    graph, ops = model.subgraphs[0], schema.BuiltinOperator
    weights = []
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) == getattr(ops, kind):
            tensor = graph.tensors[op.inputs[1]]
            if tensor.type == schema.TensorType.INT8:
                weights.append(tensor)
    tensor = max(weights, key=lambda t: int(np.prod(t.shape)))
    values = np.frombuffer(bytes(model.buffers[tensor.buffer].data), np.int8)
    if mode == "prune":
        kept = np.where(np.random.default_rng(0).random(values.size) < 0.1, values, 0).astype(np.int8)
        model.buffers[tensor.buffer].data = np.frombuffer(kept.tobytes(), np.uint8)
    else:
        from compress_dqn.deploy.c.packed import pack_int4

        model.buffers[tensor.buffer].data = pack_int4(np.clip(np.round(values / 18), -7, 7).astype(np.int8))
        tensor.type = schema.TensorType.INT4
    out.write_bytes(pack_model(model, path.stat().st_size))
    return out


def _argmax_inputs(p, folder: Path, states: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The C policy's actions and the values its action is the argmax of, raw bits, on each state."""
    from compress_dqn.deploy.c.measure import compile_shared

    found = re.search(r"return (argmax_(f32|s8))\((t\d+), (\d+)\);", p.source)
    ctype, n = ("float" if found.group(2) == "f32" else "int8_t"), int(found.group(4))
    source = p.source.replace(f"int {p.name}_act(", f"{ctype} {p.name}_values[{n}];\nint {p.name}_act(", 1).replace(
        found.group(0), f"for (int i = 0; i < {n}; ++i) {p.name}_values[i] = {found.group(3)}[i];\n  {found.group(0)}")
    folder.mkdir()
    lib = compile_shared(dataclasses.replace(p, source=source), folder)
    act = getattr(lib, f"{p.name}_act")
    values = ((ctypes.c_float if ctype == "float" else ctypes.c_int8) * n).in_dll(lib, f"{p.name}_values")
    actions, rows = [], []
    for s in states:
        x = np.ascontiguousarray(s, np.uint8)
        actions.append(act(x.ctypes.data_as(ctypes.c_void_p)))
        rows.append(np.array(values, np.float32 if ctype == "float" else np.int8))
    rows = np.array(rows)
    return actions, rows.view(np.int32) if rows.dtype == np.float32 else rows


def _reference_argmax_inputs(path: Path, states: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from compress_dqn.deploy.tflite.graph import read_policy_graph

    interp = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                         experimental_preserve_all_tensors=True)
    interp.allocate_tensors()
    index = next(op for op in read_policy_graph(path).ops if op.kind == "ARG_MAX").inputs[0].index
    rows = []
    for s in states:
        interp.set_tensor(interp.get_input_details()[0]["index"], s[None])
        interp.invoke()
        rows.append(interp.get_tensor(index).ravel().copy())
    rows = np.array(rows)
    return rows.view(np.int32) if rows.dtype == np.float32 else rows


def test_compressed_c_computes_the_dense_c_s_and_the_reference_kernels_values_bit_for_bit(minatar_variants_run, tmp_path):
    """MinAtar's pruned int8 policy (its 1024x128 FC sparse), and, made from the run's files, its QAT policy's conv
    over the whole feature map pruned (sparse) and as an INT4 kernel (packed), and its dynamic-range FC pruned
    (LiteRT's hybrid kernel): the compressed C's argmax input is the dense C's and LiteRT's reference kernels', bit
    for bit, on 300 frames; its actions theirs. Every other file of the run keeps its C byte for byte."""
    from compress_dqn.deploy.c.source import generate_c

    run = minatar_variants_run
    files = {p.parent.name: p for p in run.glob("*/**/policy.tflite")}
    made = {"prune-90-int8": (files["prune-90-int8"], "sparse"),
            "qat-conv-pruned": (_rewritten(files["qat-int8"], tmp_path / "qp.tflite", "CONV_2D", "prune"), "sparse"),
            "qat-conv-int4": (_rewritten(files["qat-int8"], tmp_path / "q4.tflite", "CONV_2D", "int4"), "packed"),
            "dynamic-pruned": (_rewritten(files["ptq-dynamic"], tmp_path / "dp.tflite", "FULLY_CONNECTED", "prune"), "sparse")}
    rng = np.random.default_rng(0)
    heldout = np.load(run / "baseline" / "heldout_obs.npz")["observations"][:200].astype(np.uint8)
    states = np.concatenate([heldout, (rng.random((100, 10, 10, 4)) < 0.15).astype(np.uint8)])
    actions = set()
    for name, (path, form) in made.items():
        compressed, dense = generate_c(path, "pol"), generate_c(path, "pol", compress=False)
        assert compressed.form == form and dense.form == "dense", name
        assert compressed.constants_bytes < dense.constants_bytes * (0.3 if form == "sparse" else 0.6), name
        ours, theirs = _argmax_inputs(compressed, tmp_path / f"{name}-c", states), _argmax_inputs(dense, tmp_path / f"{name}-d", states)
        reference = _reference_argmax_inputs(path, states)
        assert ours[0] == theirs[0] and np.array_equal(ours[1], theirs[1]), name
        assert np.array_equal(ours[1], reference), name
        assert len({row.tobytes() for row in ours[1]}) > 10, name  # values that move with the state
        actions |= {(name, a) for a in ours[0]}
    assert len(actions) > len(made)  # some policy takes more than one action
    for name in ("baseline", "ptq-int8", "qat-int8", "ptq-dynamic", "ptq-float16"):  # nothing to gain
        p = generate_c(files[name], "pol")
        assert p.form == "dense" and p.source == generate_c(files[name], "pol", compress=False).source, name


def test_an_outsiders_c_client_plays_the_runs_returns_with_the_sparse_c(minatar_variants_run, tmp_path):
    """The files `export --target c` writes (its text; the export's timing runs are not repeated here)."""
    from compress_dqn.deploy.c.source import generate_c

    results = json.loads((minatar_variants_run / "results.json").read_text())
    entry = next(v for v in results["variants"] if v["name"] == "prune-90-int8")
    p, out = generate_c(minatar_variants_run / entry["artifacts"]["tflite"], "pruned"), tmp_path / "c"
    out.mkdir()
    (out / "pruned.c").write_text(p.source)
    (out / "pruned.h").write_text(p.header)
    assert p.form == "sparse" and "sparse_dot" in p.source
    played = subprocess.run([sys.executable, str(HERE / "outsider_c_player.py"), str(out / "pruned.c"), "MinAtar/Breakout-v1",
                             str(results["eval"]["seed"]), str(len(entry["return"]["episodes"]))],
                            capture_output=True, text=True, timeout=300)
    assert played.returncode == 0, played.stderr[-2000:]
    assert json.loads(played.stdout)["returns"] == entry["return"]["episodes"]


def test_the_c_player_imports_nothing_of_compress_dqn():
    source = (HERE / "outsider_c_player.py").read_text()
    assert "compress_dqn" not in source.split('"""', 2)[2]
