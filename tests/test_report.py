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


def test_candidates_qat_to_two_teachers_are_named_in_the_report(tmp_path):
    data = json.loads(FIXED.read_text())
    student = next(v for v in data["variants"] if v["name"] == "student-32x32-qat-int8")
    student.setdefault("compression", {})["candidates"] = {
        "count": 2, "episodes": 200, "seed": 200000, "qat_teachers": ["baseline", "float"], "picked": 1,
        "builds": ["s.c0.baseline", "s.c0.float", "s.c1.baseline", "s.c1.float"],
        "fresh_differences": [-1.0, 0.5, -2.0, 0.25]}
    (tmp_path / "results.json").write_text(json.dumps(data))
    write_report(tmp_path)
    expected = ("student-32x32-qat-int8: the best of 4 builds (2 float builds, each QAT'd to the baseline and to its own float "
                "weights) by their paired difference from the baseline on 200 fresh episodes (seeds 200000.., used "
                "by nothing else): -1.0, +0.5, -2.0, +0.2; kept s.c0.float.")
    assert expected in (tmp_path / "report.md").read_text()


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
    from compress_dqn.evaluation.findings import has_c_figures
    from compress_dqn.evaluation.report import COLUMNS

    data = json.loads(FIXED.read_text())
    for with_c in (False, True):  # the C policy's columns only where some policy has C figures
        if with_c:
            data["variants"][1]["c_policy"] = {"translated": True, "integer_only": True, "counts": "what they count",
                                               "flash_bytes": {"cortex-m0plus": 3948, "cortex-m4f": 2431},
                                               "ram_bytes": {"cortex-m0plus": 284, "cortex-m4f": 236}}
        (tmp_path / "results.json").write_text(json.dumps(data))
        write_report(tmp_path)
        columns = [c for c in COLUMNS if c.shown is None or (with_c and c.shown is has_c_figures)]
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


def _at_five_percent(data: dict) -> dict:
    """The fixture as a run decided at eval.tolerance 0.05, each variant also judged at 1% on the same episodes."""
    data = json.loads(json.dumps(data))
    data["eval"]["tolerance"] = 0.05
    at_one = {"ptq-int8": {"verdict": "better", "episodes_to_decide": None},
              "prune-80": {"verdict": "inconclusive", "episodes_to_decide": 12345},
              "student-32x32-qat-int8": {"verdict": "worse", "episodes_to_decide": None}}
    for v in data["variants"][1:]:
        versus = v["return_vs_baseline"]
        versus["at_one_percent"] = {**at_one[v["name"]], "margin": versus["margin"]}
        versus["tolerance"], versus["margin"] = 0.05, 5 * versus["margin"]
        versus["verdict"] = {"ptq-int8": "better", "prune-80": "within 5%"}.get(v["name"], "inconclusive")
    return data


def test_a_run_at_a_wider_tolerance_names_it_and_says_where_each_verdict_stands_at_one_percent(tmp_path):
    from compress_dqn.evaluation.findings import findings

    data = json.loads(FIXED.read_text())
    data["search"] = {"winner": "prune-80", "objective": "gzip_bytes"}
    wide = RunResults.from_dict(_at_five_percent(data))
    assert findings(wide).wide_tolerance == 0.05 and findings(wide).search_winner_policy.name == "prune-80"
    lines = headline(wide)
    smallest = next(line for line in lines if line.startswith("Smallest policy"))
    assert smallest.startswith("Smallest policy that keeps the baseline's return within 5% of its lead: ")
    assert smallest.endswith(("; at 1%: better (4 episodes).", "; at 1%: inconclusive (~12,345 episodes would decide it)."))
    assert ("Search winner (smallest by gzip_bytes within 5% of the baseline's lead on every training seed): prune-80; "
            "at 1% on this seed: inconclusive (~12,345 episodes would decide it).") in lines
    (tmp_path / "results.json").write_text(json.dumps(wide.to_dict()))
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert ("- At 1%: each verdict against a margin of 1% of the baseline's lead (-3.30) instead of 5%, from the same "
            "CI on the same episodes (none played for it): ptq-int8 better (4 episodes); prune-80 inconclusive "
            "(~12,345 episodes would decide it); student-32x32-qat-int8 worse (4 episodes).") in report
    assert {"verdict_at_1pct", "episodes_to_decide_at_1pct"} <= set(
        (tmp_path / "results.csv").read_text().splitlines()[0].split(","))
    assert [r["verdict_at_1pct"] for r in rows(wide)] == [None, "better", "inconclusive", "worse"]

    # At 1% (the fixture as recorded) none of it: no tolerance named, no verdict at 1%, no column.
    data["search"]["winner"] = "ptq-int8"
    strict = RunResults.from_dict(data)
    lines = headline(strict)
    assert "Search winner (smallest by gzip_bytes within tolerance on every training seed): ptq-int8." in lines
    assert next(line for line in lines if line.startswith("Smallest policy")).startswith(
        "Smallest policy that keeps the baseline's return: ptq-int8")
    (tmp_path / "results.json").write_text(json.dumps(strict.to_dict()))
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "at 1%:" not in report.lower() and "within 5%" not in report
    assert "at_1pct" not in (tmp_path / "results.csv").read_text()


def test_a_search_at_a_wider_tolerance_gives_its_winner_and_candidates_at_one_percent():
    """The multi-seed report and its search section: the tolerance in the winner line and the titles, each
    seed's verdict at 1% beside the verdict that decided; the legacy search at 1% stays as it was."""
    from compress_dqn.evaluation.report import render_aggregate_markdown
    from compress_dqn.evaluation.results import SeedsResults

    legacy = json.loads((Path(__file__).parent / "data" / "legacy-a0e684b" / "search" / "results.json").read_text())
    strict = render_aggregate_markdown(SeedsResults.from_dict(legacy))
    assert "at 1%" not in strict and " 5%" not in strict and "## Search: the smallest policy within tolerance" in strict
    data = json.loads(json.dumps(legacy))
    data["eval"]["tolerance"] = data["search"]["tolerance"] = 0.05
    within = {"verdict": "within 1%", "margin": 0.1, "episodes_to_decide": None}
    open_ = {"verdict": "inconclusive", "margin": 0.1, "episodes_to_decide": 40000}
    for aggregate in data["aggregate"][1:]:
        aggregate["per_seed_verdict"] = [v.replace("within 1%", "within 5%") for v in aggregate["per_seed_verdict"]]
        aggregate["per_seed_at_one_percent"] = [within, within if aggregate["name"] == "prune-50-int8" else open_]
    for tried in data["search"]["tried"]:
        for seed, outcome in tried["per_seed"].items():
            outcome["verdict"] = outcome["verdict"].replace("within 1%", "within 5%")
            outcome["at_one_percent"] = within if seed == "0" else open_
    tried = data["search"]["tried"][0]
    tried["per_seed"]["0"]["episodes"] = 12800
    report = render_aggregate_markdown(SeedsResults.from_dict(data))
    assert ("Within 5% of the lead on every seed: student-8-qat-int8, prune-50-int8; within 1% on every seed, on "
            "the same episodes: prune-50-int8.") in report
    assert "| within 5% (5; at 1%: within 1%), within 5% (5; at 1%: inconclusive, ~40,000 to decide) | 1,406 |" in report
    assert "## Search: the smallest policy within 5% of the baseline's lead on every seed" in report
    assert ("- Winner: **student-8-qat-int8** (1,406 gzipped bytes, median over seeds); at 1%: seed 0 within 1% "
            "(12,800 episodes), seed 1 inconclusive (~40,000 episodes would decide it).") in report
    assert ("| student-8-qat-int8 | student | 48 | kept | 1,406 | 0: within 5% (12,800; at 1%: within 1%), "
            "1: within 5% (5; at 1%: inconclusive, ~40,000 to decide) |") in report
