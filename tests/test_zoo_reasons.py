"""Issue 58: the report says why a variant lost the return, from measured action gaps, Q-head steps and agreement.

No training: the diagnoses are computed from hand-made arrays and rendered into a stored results file's report;
the benchmark's smoke is a tiny generated zip searched with one tiny student."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from compress_dqn.evaluation.figures import Compression, Verdict
from compress_dqn.evaluation.diagnosis import Diagnosis, action_gaps, diagnose, diagnoses, head_step
from compress_dqn.evaluation.findings import is_student, post_training_int8
from compress_dqn.evaluation.reasons import reason_lines
from compress_dqn.evaluation.report import render_html, render_markdown, write_report
from compress_dqn.evaluation.results import load_results

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "tests" / "data" / "results_lunarlander.json"


def _q(gaps: np.ndarray) -> np.ndarray:
    """Q-values of three actions whose best-minus-second gap is `gaps` (action 0 is best)."""
    return np.stack([gaps, np.zeros_like(gaps), -np.ones_like(gaps)], axis=1) - 5.0


def test_action_gaps_are_best_minus_second_best():
    q = np.array([[1.0, 3.0, 2.5], [0.0, 0.0, -1.0], [7.0, 1.0, 2.0]])
    assert np.allclose(action_gaps(q), [0.5, 0.0, 5.0])
    assert np.allclose(action_gaps(np.ones((2, 1))), [0.0, 0.0])


def test_a_coarse_head_is_named_where_decisive_gaps_fall_below_its_step():
    gaps = np.linspace(0.01, 1.0, 100)  # median 0.505: decisive are the upper 50
    q, actions = _q(gaps), np.zeros(100, int)
    variant = actions.copy()
    variant[:10] = 1  # differs on the 10 smallest gaps only
    d = diagnose("ptq-int8", q, actions, variant, output_step=0.6)
    assert d.decisive_agreement == 1.0 and d.differing == pytest.approx(0.1)
    assert d.below_step_decisive == pytest.approx(0.2, abs=0.021)  # decisive gaps 0.51..0.60 of 0.51..1.00
    assert d.below_step_all == pytest.approx(0.6, abs=0.011) and d.differing_below_step == 1.0 and d.coarse_head
    fine = diagnose("ptq-int8", q, actions, variant, output_step=0.02)
    assert fine.below_step_decisive == 0.0 and not fine.coarse_head
    assert fine.differing_gap_median == pytest.approx(np.median(gaps[:10]))
    assert d.float_head_agreement is None and d.head_share is None
    assert d.gap_to_q == pytest.approx(np.median(gaps / np.abs(q).mean(axis=1)))
    emulated = variant.copy()
    emulated[:8] = 0  # a float head gets 8 of the 10 changed actions back
    head = diagnose("ptq-int8", q, actions, variant, output_step=0.02, float_head_actions=emulated)
    assert head.float_head_agreement == pytest.approx(0.98) and head.head_share == pytest.approx(0.8)
    floating = diagnose("student", q, actions, actions, output_step=None, student=True)
    assert floating.output_step is None and floating.below_step_decisive is None and floating.differing_gap_median is None


def _losing_run():
    """The stored LunarLander run, its ptq-int8 made worse: a variant that lost beside ones that held or not."""
    results = load_results(STORED)
    ptq = results.variant("ptq-int8")
    ptq.return_vs_baseline = ptq.return_vs_baseline.model_copy(update={"verdict": Verdict.WORSE})
    return results


def _diag(name, **fields):
    base = dict(name=name, states=1000, student=False, gap_median=0.4, decisive_agreement=1.0, differing=0.12,
                differing_gap_median=0.037, output_step=0.0172, below_step_decisive=0.0, below_step_all=0.05,
                differing_below_step=0.25)
    return Diagnosis(**{**base, **fields})


def test_the_report_names_each_losers_measured_reason_and_what_held():
    results = _losing_run()
    held = [v.name for v in results.variants[1:] if v.verdict.keeps_return]
    diags = [_diag("ptq-int8"),
             _diag("prune-80", output_step=None, below_step_decisive=None, below_step_all=None,
                   differing_below_step=None, decisive_agreement=0.91),
             _diag("student-32x32-qat-int8", student=True, decisive_agreement=0.962, output_step=0.05,
                   below_step_decisive=0.01)]
    lines = reason_lines(results, diags)
    ptq, prune, student, last = lines
    assert ptq.startswith("ptq-int8 (worse, ") and "its int8 Q-head decides in steps of 0.0172" in ptq
    assert "100.0% of the decisive states" in ptq and "differs on 12.0% of all 1000 states" in ptq
    assert "24.8%" not in ptq and "25.0% of those where its action differs" in ptq
    assert ptq.endswith("near-tied states, which add up over an episode, not by its head's step.")
    assert prune.startswith("prune-80 (inconclusive") and "on 91.0% of the decisive states" in prune
    assert "Q-head" not in prune and prune.endswith("the network's own error, not a rounding of near-ties.")
    assert student.startswith("student-32x32-qat-int8 (") and "a student: it plays the baseline's action on 96.2%" in student
    assert last == (f"Held the return in this run: {', '.join(held)}." if held else "No variant of this run held the return.")
    for coarse in (_diag("ptq-int8", output_step=0.5, below_step_decisive=0.3, below_step_all=0.7),
                   _diag("ptq-int8", output_step=0.135, below_step_all=0.27, differing_below_step=0.81)):
        (line, _) = reason_lines(results, [coarse])
        assert f"its int8 Q-head decides in steps of {coarse.output_step:g}" in line and coarse.coarse_head
        assert "the head's step rounds this policy's action gaps away. It plays" in line
        assert line.endswith("where the baseline's median gap is 0.037.")  # no remedy named for a post-training head
    for share, part in ((0.82, "most of them come from its int8 Q-head (weights and step)"),
                        (0.11, "most of them come from its int8 body (the hidden layers; the baseline's gaps are a "
                               "median 0.1% of its |Q|)")):
        emulated = _diag("ptq-int8", float_head_agreement=0.88 + 0.12 * share, gap_to_q=0.0012)
        line, _ = reason_lines(results, [emulated])
        assert f"it would play the baseline's action on {100 * (0.88 + 0.12 * share):.1f}% of all states" in line
        assert f"{100 * share:.1f}% of those it changes: {part}; its int8 Q-head decides in steps" in line
    student_line, _ = reason_lines(results, [_diag("student-32x32-qat-int8", student=True, output_step=0.135,
                                                   differing_below_step=0.81)])
    assert "a student: its int8 Q-head decides in steps of 0.135" in student_line
    assert student_line.endswith("fits the student's head range to them, and with it the step.")
    markdown, page = render_markdown(results, [], diags), render_html(results, {}, diags)
    assert "## Why variants lost the return" in markdown and ptq in markdown
    assert "<h2>Why variants lost the return</h2>" in page
    assert "Why variants lost" not in render_markdown(results, [])  # nothing measured: the report as before


def test_a_run_that_lost_nothing_or_whose_files_are_gone_reports_as_before(tmp_path):
    results = load_results(STORED)
    assert reason_lines(results, [_diag("ptq-int8")]) == []  # it did not lose
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(STORED, run / "results.json")
    assert diagnoses(_losing_run(), run) == []  # a results.json alone: no held-out states, no files
    write_report(run)
    assert "Why variants lost" not in (run / "report.md").read_text()
    assert head_step(tmp_path / "missing.tflite") is None
    assert not any(post_training_int8(v) for v in results.variants)  # a file that kept no compression blocks
    assert [is_student(v) for v in results.variants[1:]] == [False, False, True]  # by its preset's name
    ptq = results.variant("ptq-int8")
    assert post_training_int8(ptq.model_copy(update={"compression": Compression(quantize={"mode": "int8"})}))
    for other in ({"quantize": {"mode": "qat"}}, {"quantize": {"mode": "int8"}, "fine_tune": {"steps": 10}},
                  {"quantize": {"mode": "int8"}, "student": {"net_arch": [8]}}):
        built = ptq.model_copy(update={"compression": Compression(**other)})
        assert not post_training_int8(built) and is_student(built) == ("student" in other)


def test_zoo_search_smoke_reads_a_finished_search_of_its_tiny_zip(tmp_path):
    """benchmarks/zoo_search.py --smoke on a directory that already holds a finished search (a stored two-seed search of
    a tiny run): it reads the search instead of rerunning it (a fresh --smoke generates its tiny QR-DQN zip and
    searches it with one 8-unit student, ~30 s on 2 cores), and gives the winner, the ratio gzip to gzip and the
    line's test."""
    out = tmp_path / "s"
    shutil.copytree(ROOT / "tests" / "data" / "legacy-a0e684b" / "search", out / "qrdqn-CartPole-v1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zoo_search.py"), "--out", str(out), "--smoke"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                          timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    row, summary = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert (row["algo"], row["env_id"]) == ("qrdqn", "CartPole-v1") and row["seconds"] is None  # read, not rerun
    assert row["command"].startswith("compress-dqn search ") and "--students 8" in row["command"]
    assert row["winner"] == "student-8-qat-int8" and [t["name"] for t in row["tried"]][0] == row["winner"]
    assert row["ratio"] == round(row["baseline"]["gzip_bytes"] / row["winner_gzip_bytes"], 1)
    assert row["meets_line"] == (row["ratio"] >= 50) and set(row["winner_per_seed"]) == {"0", "1"}
    assert row["meets_line"] or "reasons" in row  # the stored run has no TFLite files: no reason measured
    assert summary == {"summary": True, "agents": 1, "meet_line": int(row["meets_line"]), "line": 50.0,
                       "winners": {"qrdqn/CartPole-v1": "student-8-qat-int8"}}
    assert seconds < 15
