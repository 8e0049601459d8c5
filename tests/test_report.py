"""Report rendering from a fixed results.json (trimmed from a real LunarLander run)."""

import json
import shutil
from pathlib import Path

from compress_dqn.evaluation.report import headline, pareto_front, rows, write_report
from compress_dqn.evaluation.results import RunResults

from conftest import cli

FIXED = Path(__file__).parent / "data" / "results_lunarlander.json"


def test_pareto_front():
    costs, returns = [1, 2, 3, 4, 5], [10, 30, 20, 40, 40]
    assert pareto_front(costs, returns) == [0, 1, 3]
    assert pareto_front([1, 1], [5, 5]) == [0, 1]  # ties dominate neither


def test_rows_and_headline_from_fixed_results():
    results = RunResults.from_dict(json.loads(FIXED.read_text()))
    table = rows(results)
    assert [r["name"] for r in table] == ["baseline", "ptq-int8", "prune-80", "student-32x32-qat-int8"]
    assert table[0]["verdict"] == "reference"
    lines = headline(results)
    assert lines[0].startswith("Baseline return 142.7 over 4 episodes; a uniform-random policy gets")
    assert lines[1].startswith("Smallest policy that keeps the baseline's return: ptq-int8")  # the others are open
    # Like with like: gzip to gzip, and raw to raw.
    base, ptq = table[0], table[1]
    assert f"{base['tflite_gzip_bytes'] / ptq['tflite_gzip_bytes']:.1f}x smaller than the fp32 baseline's" in lines[1]
    assert f"({base['tflite_bytes'] / ptq['tflite_bytes']:.1f}x smaller raw to raw)" in lines[1]
    # Paired: the baseline's mean on the variant's own episodes, not over however many the longest verdict used.
    assert f"vs the baseline's {ptq['return_mean'] - ptq['diff_mean']:.1f} on the same {ptq['episodes']} episodes" in lines[1]
    assert any(line.startswith("Not decided within 100 episodes: prune-80") and "student-32x32-qat-int8" in line
               and "raise eval.max_episodes" in line
               for line in lines)
    assert [r["verdict"] for r in table] == ["reference", "better", "inconclusive", "inconclusive"]
    assert table[1]["normalized_score"] > 1.0 and table[0]["normalized_score"] == 1.0
    assert any("MiB" in line for line in lines)


def test_write_report_files(tmp_path):
    shutil.copy(FIXED, tmp_path / "results.json")
    written = {p.name for p in write_report(tmp_path)}
    assert {"results.csv", "report.md", "report.html", "return_vs_size.png", "latency.png", "memory.png"} <= written
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("name,return_mean")
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len([n for n in written if n.endswith(".png")])
    assert "no GPU on this machine" in html and "prune-80" in html
    for name in written:
        if name.endswith(".png"):
            assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_cli(tmp_path):
    shutil.copy(FIXED, tmp_path / "results.json")
    assert cli("report", str(tmp_path)).returncode == 0
    missing = cli("report", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no results.json" in missing.stderr
    (tmp_path / "results.json").write_text("{}")
    broken = cli("report", str(tmp_path))
    assert broken.returncode == 2 and "not a compress-dqn results file" in broken.stderr


def test_headline_says_how_many_episodes_would_decide_an_open_verdict():
    from compress_dqn.evaluation.verdicts import episodes_to_decide

    results = RunResults.from_dict(json.loads(FIXED.read_text()))
    versus = results.variant("prune-80").return_vs_baseline
    versus.episodes_to_decide = 1234  # as stored by an older rule: the report recomputes it from the CI
    expected = episodes_to_decide(versus.episodes, *versus.ci, versus.mean, versus.margin)
    assert expected != 1234
    lines = headline(results)
    assert any(f"Not decided within 100 episodes: prune-80 (~{expected:,} would decide it)" in line
               and "(paired episodes, if the mean difference and its spread hold)." in line for line in lines)


def test_headline_does_not_call_slower_faster_or_larger_smaller_or_a_random_level_baseline_a_reference():
    results = RunResults.from_dict(json.loads(FIXED.read_text()))
    ptq, base = results.variant("ptq-int8"), results.baseline
    cpu = ptq.latency_us.cpu
    cpu.tflite = cpu.tflite.model_copy(update={"p50": 2 * base.latency_us.cpu.tflite.p50})
    ptq.size = ptq.size.model_copy(update={"tflite_gzip_bytes": 2 * base.size.tflite_gzip_bytes})
    lines = headline(results)
    assert not any(line.startswith("Fastest:") for line in lines)
    assert any(line.startswith("None of the policies that keep the return is faster than the fp32 TFLite baseline")
               for line in lines)
    assert any("2.0x larger than the fp32 baseline's" in line for line in lines)
    results.random.returns = results.random.returns.model_copy(update={"mean": base.returns.mean + 1.0})
    lines = headline(results)
    assert lines[0].startswith("Warning: the baseline") and "does not beat a uniform-random policy" in lines[0]
    assert rows(results)[0]["normalized_score"] is None


def test_notes_say_how_long_the_baseline_trained_and_which_weights_it_kept(tmp_path):
    data = json.loads(FIXED.read_text())
    data["train"].update(env_steps=17500, selected_step=17500, selected_eval_return=500.0, wall_seconds=16.4)
    (tmp_path / "results.json").write_text(json.dumps(data))
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Baseline: trained 17,500 environment steps in 16 s; kept the weights of step 17,500 (periodic evaluation 500.0)." in report
    data["train"]["selected_step"] = None
    (tmp_path / "results.json").write_text(json.dumps(data))
    write_report(tmp_path)
    assert "Baseline: trained 17,500 environment steps in 16 s; kept the last weights." in (tmp_path / "report.md").read_text()


def test_a_run_that_probes_tensorflow_memory_for_the_baseline_only_says_so(tmp_path):
    """measure.saved_model_memory: baseline leaves the variants' TF RSS empty: the table shows '-',
    the headline says why, and the memory plot still renders."""
    data = json.loads(FIXED.read_text())
    for variant in data["variants"][1:]:
        variant["memory_bytes"]["cpu_rss"]["saved_model"] = None
    (tmp_path / "results.json").write_text(json.dumps(data))
    results = RunResults.from_dict(data)
    table = rows(results)
    assert table[0]["saved_model_peak_rss"] > 0 and all(r["saved_model_peak_rss"] is None for r in table[1:])
    assert all(r["tflite_peak_rss"] > 0 for r in table)
    serving = [line for line in headline(results) if line.startswith("Serving memory")]
    assert serving and serving[0].endswith("probed for the baseline only (measure.saved_model_memory: baseline).")
    assert "probed for the baseline only" not in " ".join(headline(RunResults.from_dict(json.loads(FIXED.read_text()))))
    written = {p.name for p in write_report(tmp_path)}
    assert "memory.png" in written
    md = (tmp_path / "report.md").read_text()
    student_row = next(line for line in md.splitlines() if line.startswith("| student-32x32-qat-int8 |"))
    assert student_row.rstrip(" |").split("|")[-2].strip() == "-"  # TF RSS MiB, before the MCU arena column


def test_a_variant_picked_among_candidates_says_what_each_build_scored_and_which_it_kept(tmp_path):
    data = json.loads(FIXED.read_text())
    student = next(v for v in data["variants"] if v["name"] == "student-32x32-qat-int8")
    student.setdefault("compression", {})["candidates"] = {"count": 3, "episodes": 200, "seed": 200000, "picked": 1,
                                                           "fresh_differences": [-4.25, 2.5, -30.0]}
    (tmp_path / "results.json").write_text(json.dumps(data))
    write_report(tmp_path)
    expected = ("student-32x32-qat-int8: the best of 3 builds by their paired difference from the baseline on 200 fresh "
                "episodes (seeds 200000.., used by nothing else): -4.2, +2.5, -30.0; kept build 1.")
    assert expected in (tmp_path / "report.md").read_text()
    assert "student-32x32-qat-int8: the best of" in (tmp_path / "report.html").read_text()
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    (tmp_path / "results.json").write_text(FIXED.read_text())
    write_report(tmp_path)
    assert "the best of" not in (tmp_path / "report.md").read_text()


def test_a_baseline_only_run_says_it_has_no_variants_not_that_none_kept_the_return():
    from compress_dqn.evaluation.report import NO_VARIANTS

    data = json.loads(FIXED.read_text())
    data["variants"] = [v for v in data["variants"] if v["name"] == "baseline"]
    lines = headline(RunResults.from_dict(data))
    assert NO_VARIANTS in lines and not any("No variant kept" in line for line in lines)


def test_findings_are_computed_apart_from_their_wording():
    from compress_dqn.evaluation.findings import findings
    from compress_dqn.evaluation.results import load_results

    legacy = findings(load_results(Path(__file__).parent / "data" / "legacy-a0e684b" / "run" / "results.json"))
    assert legacy.weak_baseline and legacy.smallest.name == "student" and [v.name for v in legacy.keepers] == [
        "ptq-int8", "student", "prune-50"]
    assert legacy.micro_fit.budget == 32 * 1024 and legacy.micro_fit.count == 3 and legacy.micro_fit.best.name == "student"
    assert legacy.speed.fastest.name == "student" and not legacy.speed.faster
    assert legacy.serving_memory.baseline_only and legacy.undecided == [] and legacy.search_winner is None
    lunar = findings(RunResults.from_dict(json.loads(FIXED.read_text())))
    assert [u.name for u in lunar.undecided] == ["prune-80", "student-32x32-qat-int8"]
    assert lunar.smallest.name == "ptq-int8" and not lunar.weak_baseline


def test_the_table_and_the_csv_read_one_list_of_columns(tmp_path):
    from compress_dqn.evaluation.report import COLUMNS

    data = json.loads(FIXED.read_text())
    for with_c in (False, True):  # the C policy's columns only where some policy has C figures
        if with_c:
            data["variants"][1]["c_policy"] = {"translated": True, "integer_only": True, "counts": "what they count",
                                               "flash_bytes": {"cortex-m0plus": 3948, "cortex-m4f": 2431},
                                               "ram_bytes": {"cortex-m0plus": 284, "cortex-m4f": 236}}
        (tmp_path / "results.json").write_text(json.dumps(data))
        write_report(tmp_path)
        columns = [c for c in COLUMNS if with_c or c.shown is None]
        header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
        assert header == [c.key for c in columns if c.key is not None]
        table = [c for c in columns if c.header is not None]
        assert sorted(c.table for c in table) == list(range(len(table)))  # each table column has its own place
        report = (tmp_path / "report.md").read_text()
        md_header = next(line for line in report.splitlines() if line.startswith("| variant"))
        assert md_header == "| " + " | ".join(c.header for c in sorted(table, key=lambda c: c.table)) + " |"
        assert [c.header for c in table if c.colored] == ["verdict"]
        assert ("| 3.9 KB / 284 B | 2.4 KB / 236 B |" in report) == with_c  # KB = 1,024 B
        assert ("C M0+ / M4F flash / RAM: " in report) == with_c


def test_the_report_says_which_atari_preprocessing_a_ported_agent_played_behind():
    from compress_dqn.evaluation.results import PortCheck

    note = "Atari preprocessing: SB3's AtariWrapper (noop_max 30, ...) with 4 stacked frames (a bare zip)."
    check = PortCheck(format="a Stable-Baselines3 zip", checked=True, states=512, runtime="SB3 2.9.2",
                      max_abs_q_diff=1e-7, action_agreement=1.0, notes=["VecNormalize folded in", note])
    assert check.summary().endswith(note) and "VecNormalize" not in check.summary()
    assert "Atari" not in PortCheck(format="an ONNX model", checked=False, states=1, reason="no runtime").summary()
