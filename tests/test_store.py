"""The run store: one layout owns a run directory's paths, and stages.json reads back into typed records."""

import json
import shutil
from pathlib import Path

import pytest

from compress_dqn.errors import UserError
from compress_dqn.evaluation.ranges import EvalRanges
from compress_dqn.recipe.schema import EvalConfig
from compress_dqn.store import records
from compress_dqn.store.layout import BASELINE, RunLayout
from compress_dqn.store.stage_keys import StageKey
from compress_dqn.store.stages import Stages

LEGACY = Path(__file__).parent / "data" / "legacy-a0e684b"
"""Run directories written by a0e684b (see its README.md): a later release must read them."""

RECORD_OF_KIND = {"train": records.TrainRecord, "export": records.ExportRecord, "evaluate": records.EvaluateRecord,
                  "random": records.RandomRecord, "heldout": records.HeldoutRecord, "variant": records.VariantRecord,
                  "memory": records.MemoryRecord, "measure": records.MeasureRecord, "look": records.LookRecord,
                  "reference": records.ReferenceRecord}


@pytest.mark.parametrize("run", ["run", "search/seed-0"])
def test_a_previous_releases_stages_read_typed_and_save_back_unchanged(run, tmp_path):
    """Every stage of a0e684b's stages.json reads into its record and writes back the same JSON, so a
    run started by that release resumes and finishes with this one."""
    shutil.copy(LEGACY / run / "stages.json", tmp_path / "stages.json")
    stored = json.loads((tmp_path / "stages.json").read_text())
    stages = Stages(tmp_path)
    for key in stored:
        record = stages.get(key, RECORD_OF_KIND[StageKey.parse(key).kind])
        stages.finish(key, record)
    assert json.loads((tmp_path / "stages.json").read_text()) == stored
    variant = stages.get("variant:ptq-int8", records.VariantRecord) if run == "run" else None
    if variant is not None:
        assert variant.returns.episodes and variant.size.tflite_gzip_bytes > 0
        assert variant.artifacts.tflite == "variants/ptq-int8/policy.tflite"


def test_a_stage_that_does_not_hold_its_record_is_one_line(tmp_path):
    (tmp_path / "stages.json").write_text(json.dumps({"export": {"artifacts": "not a dict"}}))
    with pytest.raises(UserError, match=r"stage 'export' does not hold a ExportRecord"):
        Stages(tmp_path).get("export", records.ExportRecord)
    assert Stages(tmp_path).find("evaluate", records.EvaluateRecord) is None


def test_the_layout_names_every_path_of_a_run(tmp_path):
    layout = RunLayout(tmp_path / "run")
    assert layout.policy(BASELINE).tflite == tmp_path / "run" / "baseline" / "policy.tflite"
    assert layout.policy("ptq-int8").saved_model == tmp_path / "run" / "variants" / "ptq-int8" / "saved_model"
    assert layout.artifacts("ptq-int8") == {"saved_model": "variants/ptq-int8/saved_model",
                                            "tflite": "variants/ptq-int8/policy.tflite"}
    assert layout.seed(3).weights == tmp_path / "run" / "seed-3" / "baseline" / "weights.npz"
    assert layout.policy("s").candidate("s.c1").tflite == tmp_path / "run" / "variants" / "s" / "candidates" / "s.c1" / "policy.tflite"
    assert RunLayout.find(tmp_path / "run") is None  # nothing written yet
    layout.root.mkdir()
    layout.recipe.write_text("name: x\n")
    layout.stages.write_text("{}")
    layout.baseline.mkdir()
    assert RunLayout.find(layout.root) == layout and RunLayout.find(layout.baseline) == layout
    assert RunLayout.find(layout.variants) is None


def test_the_evaluation_ranges_are_the_recipes_seeds():
    ranges = EvalRanges.of(EvalConfig(episodes=100, seed=7, max_episodes=400, heldout_seed=10_000, heldout_episodes=3))
    assert ranges.first == range(7, 107) and ranges.episode_seeds(100, 200) == range(107, 207)
    assert ranges.looks == [100, 200, 400] and ranges.confidence == pytest.approx(1 - 0.05 / 3)
    assert ranges.heldout == range(10_000, 10_003)
    assert EvalRanges.of(EvalConfig(episodes=5)).looks == [5]
