"""Stage keys read back as they were built, so resume and forget_missing find every stage of a policy."""

from compress_dqn.evaluation.figures import Record
from compress_dqn.store import stage_keys as keys
from compress_dqn.store.stage_keys import StageKey


def test_every_key_parses_back_to_its_parts():
    assert StageKey.parse(keys.variant("student-32x32.c1")) == StageKey("variant", "student-32x32.c1")
    assert StageKey.parse(keys.measure("baseline")) == StageKey("measure", "baseline")
    assert StageKey.parse(keys.memory("ptq-int8")) == StageKey("memory", "ptq-int8")
    assert StageKey.parse(keys.look(200, "prune_80")) == StageKey("look", "prune_80", 200)
    assert StageKey.parse(keys.reference(400)) == StageKey("reference", look=400)
    assert StageKey.parse("train") == StageKey("train")
    assert keys.look(200, "a") == "look:200:a" and keys.reference(400) == "reference:400"  # stages.json stays as written


class Outputs(Record):
    """Any stage's record, as far as forget_missing reads one: the files it points at."""

    artifacts: dict[str, str] | None = None


def test_a_deleted_variant_forgets_its_own_stages_only(tmp_path):
    from compress_dqn.store.stages import Stages

    stages = Stages(tmp_path)
    (tmp_path / "variants" / "a").mkdir(parents=True)
    (tmp_path / "variants" / "a" / "policy.tflite").write_bytes(b"x")
    for name in ("a", "a.b"):
        stages.finish(keys.variant(name), Outputs(artifacts={"tflite": f"variants/{name}/policy.tflite"}))
        stages.finish(keys.look(200, name), Outputs())
        stages.finish(keys.memory(name), Outputs())
    stages.finish(keys.reference(200), Outputs())
    forgotten = stages.forget_missing()  # variants/a.b/ is gone
    assert sorted(forgotten) == sorted([keys.variant("a.b"), keys.look(200, "a.b"), keys.memory("a.b")])
    assert keys.look(200, "a") in stages.done and keys.reference(200) in stages.done


def test_a_hand_edited_key_that_does_not_parse_is_one_line_not_a_traceback(tmp_path):
    import json

    import pytest

    from compress_dqn.errors import UserError
    from compress_dqn.store.stages import Stages

    (tmp_path / "stages.json").write_text(json.dumps({"train": {}, "look:x:a": {}}))
    with pytest.raises(UserError, match="unreadable"):
        Stages(tmp_path)
