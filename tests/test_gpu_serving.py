"""`bench POLICY.onnx --device gpu|cpu`: the ONNX interpreter takes onnxruntime's actions on every export form,
the CPU device runs the whole measurement (no TensorFlow), a machine without a GPU says what is missing, and
GPU figures attach to a finished run: results.json's gpu_serving and the report's GPU section."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.evaluation.results import load_results

LEGACY_RUN = Path(__file__).parent / "data" / "legacy-a0e684b" / "run"


def _tiny_onnx(path: Path) -> Path:
    """A 4-16-2 fp32 Q-network as `export --target onnx` lays one out (Gemm, Relu, ArgMax, Cast, Identity)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
             for name, shape in (("w0", (16, 4)), ("b0", (16,)), ("w1", (2, 16)), ("b1", (2,)))]
    nodes = [helper.make_node("Gemm", ["observations", "w0", "b0"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w1", "b1"], ["q"], transB=1),
             helper.make_node("ArgMax", ["q"], ["i"], axis=-1, keepdims=0), helper.make_node("Cast", ["i"], ["a"], to=6),
             helper.make_node("Identity", ["a"], ["action"]), helper.make_node("Identity", ["q"], ["q_values"])]
    graph = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("observations", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("action", TensorProto.INT32, ["batch"]),
                               helper.make_tensor_value_info("q_values", TensorProto.FLOAT, ["batch", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def _has_a_gpu() -> bool:
    import onnxruntime
    import torch

    return torch.cuda.is_available() or "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def test_bench_device_gpu_without_a_gpu_says_what_is_missing_in_one_line(tmp_path):
    if _has_a_gpu():
        pytest.skip("this machine has a CUDA runtime: bench --device gpu measures instead of refusing")
    done = CliRunner().invoke(main, ["bench", str(_tiny_onnx(tmp_path / "p.onnx")), "--device", "gpu"])
    assert done.exit_code == 2
    line = done.output.strip()
    assert "\n" not in line and line.startswith("error: bench --device gpu: ")
    assert "CUDA" in line and "pip install" in line and "--device cpu" in line


def test_bench_refuses_what_it_cannot_measure_in_one_line(tmp_path):
    onnx_file = _tiny_onnx(tmp_path / "p.onnx")
    cases = {(str(onnx_file),): "add --device", (str(onnx_file), "--device", "cpu", "--batches", "0,4"): "--batches",
             (str(tmp_path / "p.tflite"), "--device", "cpu"): "export it first",
             (str(tmp_path / "missing.onnx"), "--device", "cpu"): "no such file"}
    (tmp_path / "p.tflite").write_bytes(b"x")
    for args, message in cases.items():
        done = CliRunner().invoke(main, ["bench", *args])
        assert done.exit_code == 2 and message in done.output and done.output.count("\n") == 1, (args, done.output)


def test_bench_device_cpu_serves_by_batch_without_tensorflow(tmp_path):
    """The command a GPU machine runs, on the CPU device, in a fresh interpreter that never imports TensorFlow."""
    onnx_file, out = _tiny_onnx(tmp_path / "student.onnx"), tmp_path / "bench.json"
    code = ("import sys; from compress_dqn.cli import main\n"
            "try: main(['bench', sys.argv[1], '--device', 'cpu', '--batches', '1,8', '--seconds', '0.01', '--out', sys.argv[2]])\n"
            "except SystemExit as e: assert not e.code, e.code\n"
            "assert 'tensorflow' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code, str(onnx_file), str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    bench = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == bench
    assert bench["policy"] == "student" and bench["device"] == "cpu" and bench["form"] == "fp32" and not bench["tf32"]
    assert [b["batch"] for b in bench["batches"]] == [1, 8]
    for b in bench["batches"]:
        assert b["actions_differing"] == 0 and "graph" not in b and b["peak_bytes"] is None
        assert b["eager"]["calls"] >= 20 and [c["threads"] for c in b["cpu"]][0] == 1
    assert bench["graph_note"] and bench["memory_note"] and bench["context_bytes"] is None


def test_the_crossover_is_where_the_device_wins_from_on():
    from compress_dqn.evaluation.serving.figures import BatchFigures, CpuRun, TimedCalls, crossover

    def figures(batch: int, device: float, cpu: float) -> BatchFigures:
        return BatchFigures(batch=batch, eager=TimedCalls(p50_us=device * 5, calls=20), graph=TimedCalls(p50_us=device, calls=20),
                            cpu=[CpuRun(runtime="ort", threads=1, p50_us=cpu, calls=20)], actions_differing=0)

    assert crossover([figures(1, 30, 20), figures(64, 40, 80), figures(1024, 100, 900)]) == 64
    assert crossover([figures(1, 10, 20), figures(64, 90, 80), figures(1024, 100, 900)]) == 1024
    assert crossover([figures(1, 10, 20), figures(64, 40, 30)]) is None


def _gpu_bench(tmp_path: Path, policy: str) -> Path:
    """A bench file as a GPU machine writes one: the CPU device's figures, with the GPU's fields filled in."""
    from compress_dqn.evaluation.serving.bench import bench_on_device

    bench = bench_on_device(_tiny_onnx(tmp_path / f"{policy}.onnx"), "cpu", [1, 64], seconds=0.001, min_calls=3)
    bench.device, bench.context_bytes, bench.graph_note, bench.memory_note = "cuda", 651_000_000, None, None
    bench.machine.device = "NVIDIA H200"
    for b, (graph, peak) in zip(bench.batches, ((34.0, 5_600), (44.0, 260_000))):
        b.graph = type(b.eager)(p50_us=graph, calls=100)
        b.peak_bytes = peak
        b.cpu[0].p50_us = b.cpu[-1].p50_us = 23.0 if b.batch == 1 else 86.0
    bench.batches[0].eager.p50_us, bench.batches[1].eager.p50_us = 500.0, 520.0
    bench.crossover_batch = 64
    path = tmp_path / f"{policy}.json"
    path.write_text(bench.model_dump_json())
    return path


def test_gpu_figures_attach_to_a_finished_run_and_the_report_shows_them(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LEGACY_RUN, run)
    done = CliRunner().invoke(main, ["report", str(run), "--gpu", str(_gpu_bench(tmp_path, "student"))])
    assert done.exit_code == 0, done.output
    results = load_results(run / "results.json")
    assert results.schema_version == 3 and [b.policy for b in results.gpu_serving] == ["student"]
    assert (run / "gpu" / "student.json").is_file()
    report = (run / "report.md").read_text()
    section = report.split("## GPU serving")[1].split("Notes:")[0]
    assert "student from batch 64" in section and "NVIDIA H200" in section and "0.65 GB" in section
    assert "| student | fp32 | 1 | 34.0 | 500 | 23.0 (1) | CPU 1.5x | 0.01 MB | 0 / 1 |" in section
    assert "| student | fp32 | 64 | 44.0 | 520 | 86.0 (1) | GPU 2.0x | 0.26 MB | 0 / 64 |" in section
    assert "holds for the machine named" in section and "GPU serving" in (run / "report.html").read_text()
    done = CliRunner().invoke(main, ["report", str(run)])  # the run holds its figures: a re-render keeps them
    assert done.exit_code == 0 and "## GPU serving" in (run / "report.md").read_text()


def test_gpu_figures_that_are_not_the_run_s_or_not_a_gpu_s_are_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LEGACY_RUN, run)
    other = _gpu_bench(tmp_path, "someone-else")
    on_cpu = tmp_path / "cpu.json"
    on_cpu.write_text(other.read_text().replace('"cuda"', '"cpu"'))
    for path, message in ((other, "which this run does not hold"), (on_cpu, "not on a GPU"),
                          (run / "results.json", "not a `bench --device` file")):
        done = CliRunner().invoke(main, ["report", str(run), "--gpu", str(path)])
        assert done.exit_code == 2 and message in done.output and done.output.count("\n") == 1, done.output
    assert load_results(run / "results.json").schema_version == 2 and not (run / "gpu").exists()


def _interpreter_differs(onnx_file: Path, states: np.ndarray, optimized: bool) -> int:
    """States where the interpreter's action (torch, CPU) differs from onnxruntime's."""
    import onnxruntime as ort

    from compress_dqn.deploy.onnx.torch_runtime import OnnxTorchPolicy, read_onnx

    options = ort.SessionOptions()
    if not optimized:  # QDQ as ONNX defines it, op by op: no fused int8 kernels with their own rounding
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    theirs = session.run(["action"], {"observations": states})[0]
    return int(np.count_nonzero(OnnxTorchPolicy(read_onnx(onnx_file), "cpu").actions(states) != theirs))


def _forms(tflite: Path, folder: Path) -> dict[str, Path]:
    """The file's ONNX exports: the exact form, and the QDQ one where the policy is int8."""
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.deploy.onnx.export import export as export_onnx

    written = {}
    for form in ("exact", "qdq"):
        out = folder / f"{tflite.parent.name}-{tflite.stem}.{form}.onnx"
        written[export_onnx(tflite, out, ExportOptions(onnx_int8=form)).quantized] = out
    return written


def test_the_interpreter_takes_onnxruntime_s_actions_on_every_export_of_a_run(tiny_variants_run, tmp_path):
    states = np.random.default_rng(0).normal(0, 1.5, (300, 4)).astype(np.float32)
    kinds = set()
    for tflite in sorted(tiny_variants_run.glob("*/**/policy.tflite")):
        for kind, onnx_file in _forms(tflite, tmp_path).items():
            kinds.add(kind.split(" ")[0])
            assert _interpreter_differs(onnx_file, states, optimized=kind != "QDQ int8") == 0, (tflite, kind)
    assert kinds >= {"fp32", "int8", "QDQ"}


@pytest.mark.slow
def test_the_interpreter_plays_conv_and_dynamic_range_exports(tmp_path):
    """A MinAtar-shaped CNN (3x3 'same' conv: Pad and ConvInteger), full int8 and dynamic range (hybrid conv and dense)."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.quantize import converter_setup
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.deploy.tflite.outputs import with_float_q_values
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.recipe.schema import QuantizeConfig

    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((10, 10, 4)), tf_keras.layers.Rescaling(1 / 255, name="rescale"),
                                 tf_keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_0"),
                                 tf_keras.layers.Flatten(name="flatten"), tf_keras.layers.Dense(8, activation="relu", name="hidden_0"),
                                 tf_keras.layers.Dense(3, name="q_values")])
    saved = export_saved_model(split_value_advantage(model), (10, 10, 4), np.uint8, tmp_path / "saved_model")
    states = np.random.default_rng(0).integers(0, 2, (200, 10, 10, 4)).astype(np.uint8) * 255
    kinds = set()
    for mode in ("int8", "dynamic"):
        tflite = tmp_path / mode / "policy.tflite"
        tflite.parent.mkdir()
        tflite.write_bytes(with_float_q_values(convert_tflite(saved, converter_setup(QuantizeConfig(mode=mode), states[:64]))))
        for kind, onnx_file in _forms(tflite, tmp_path).items():
            kinds.add(kind.split(" ")[0])
            assert _interpreter_differs(onnx_file, states, optimized=kind != "QDQ int8") == 0, (mode, kind)
    assert kinds == {"int8", "QDQ", "hybrid"}
