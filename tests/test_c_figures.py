"""The generated C policy's measured flash and RAM in a run: the measure stage records them for every policy where
the `c` extra (zig cc, pyelftools) is installed, results.json keeps them typed and the report shows them beside
TFLite Micro's figures; without the extra there are none, and the report says so once."""

import json
import shutil

from compress_dqn.deploy.c import measure as c_measure
from compress_dqn.evaluation.figures import C_TARGETS, M0PLUS, M4F
from compress_dqn.evaluation.report import kib
from compress_dqn.evaluation.results import load_results
from compress_dqn.run import measuring


def test_a_run_records_each_policys_c_flash_and_ram_and_its_report_shows_them(tiny_variants_run):
    assert c_measure.available(), "the test extra installs ziglang and pyelftools"
    data = json.loads((tiny_variants_run / "results.json").read_text())
    results = load_results(tiny_variants_run / "results.json")
    assert "c_policy_note" not in data and all("c_policy" in v for v in data["variants"])
    for v in results.variants:  # the baseline and every variant: translated and measured, or the reason why not
        assert (v.c_policy.flash_bytes is not None) == (v.c_policy.reason is None), (v.name, v.c_policy)
    ptq = results.variant("ptq-int8").c_policy
    assert ptq.translated and ptq.integer_only and not results.baseline.c_policy.integer_only
    for target in C_TARGETS:
        flash, ram = ptq.on(target)
        assert flash > ram > 4 * 4  # the observation buffer at least
    # On a Cortex-M0+ the 64-bit multiplies are library code: more flash than on an M4F.
    assert ptq.on(M0PLUS)[0] > ptq.on(M4F)[0]
    # What the stage recorded is what the C export measures of the policy's file.
    assert ptq == c_measure.c_summary(tiny_variants_run / results.variant("ptq-int8").artifacts["tflite"])
    # measure.c_policy: none translates only: the same record less flash and RAM, and the reason why.
    translated = c_measure.c_summary(tiny_variants_run / results.variant("ptq-int8").artifacts["tflite"], cross_compile=False)
    assert translated == ptq.model_copy(update={"flash_bytes": None, "ram_bytes": None, "reason": c_measure.NOT_COMPILED})

    report = (tiny_variants_run / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| variant"))
    assert header.endswith("| MCU arena B | C M0+ flash / RAM | C M4F flash / RAM |")
    (row,) = [line for line in report.splitlines() if line.startswith("| ptq-int8 |")]
    assert row.endswith(f"| {kib(ptq.on(M0PLUS)[0])} / {kib(ptq.on(M0PLUS)[1])} "
                        f"| {kib(ptq.on(M4F)[0])} / {kib(ptq.on(M4F)[1])} |")
    assert ptq.counts in report and "KB = 1,024 B" in report
    csv_header, *csv_rows = (tiny_variants_run / "results.csv").read_text().splitlines()
    column = csv_header.split(",").index("c_m4f_flash_bytes")
    assert next(r for r in csv_rows if r.startswith("ptq-int8,")).split(",")[column] == str(ptq.on(M4F)[0])


def test_without_zig_no_policy_has_c_figures_and_the_report_says_so_once(tiny_variants_run, tmp_path, monkeypatch):
    """The baseline re-measured in a copy of the run with zig cc missing: no record, no column, one note."""
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.context import reopen_run
    from compress_dqn.run.pipeline import finish_run
    from compress_dqn.store import stage_keys as keys

    monkeypatch.setattr(c_measure, "zig_available", lambda: False)
    run = tmp_path / "run"
    shutil.copytree(tiny_variants_run, run)
    assert measuring.c_figures(run / "baseline" / "policy.tflite") is None
    logged = []
    ctx = reopen_run(load_recipe(run / "recipe.yaml", ["variants=[]"]), run, quiet=True, log=logged.append)
    ctx.stages.forget([keys.measure("baseline")])
    results = finish_run(ctx)
    assert results.baseline.c_policy is None and results.c_policy_note == measuring.C_NOT_MEASURED
    data = json.loads((run / "results.json").read_text())
    assert "c_policy" not in data["variants"][0] and data["c_policy_note"] == measuring.C_NOT_MEASURED
    (line,) = [line for line in logged if line.startswith("[baseline] TFLite p50")]
    assert "Cortex" not in line and "pip install" not in line  # nothing said per policy
    report = (run / "report.md").read_text()
    assert "C M4F" not in report and report.count("pip install 'compress-dqn[c]'") == 1
    assert "c_m4f_flash_bytes" not in (run / "results.csv").read_text()


def test_the_tests_sharing_a_run_are_one_xdist_group(tiny_variants_run, request):
    """make test runs pytest-xdist with --dist loadgroup so that the one worker a shared run's tests go to builds
    it once; with pytest 9.2 the grouping silently stopped (every worker built every run), hence the pin."""
    assert request.node.get_closest_marker("xdist_group").args == ("tiny_variants_run",)
    if getattr(request.config.option, "loadgroup", False):  # in an xdist worker: the scheduler saw the group
        assert request.node.nodeid.endswith("@tiny_variants_run"), request.node.nodeid
