"""Fuzz: 1,000 mutated recipes through the CLI. Every bad one gets exit code 2 and a one-line
`error: ...`, never a traceback, and `run` creates no run directory for it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress_dqn.cli import main

from conftest import TINY

pytestmark = pytest.mark.slow  # a thousand CLI invocations

BASE = yaml.safe_load(TINY.read_text())
BASE["variants"] = [{"name": "ptq", "quantize": {"mode": "int8", "calibration_samples": 10}},
                    {"name": "pr", "prune": {"sparsity": 0.5}, "fine_tune": {"steps": 10}}]


def _paths(data, prefix=()):
    """Every key path in the recipe (through lists by index)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


PATHS = sorted(_paths(BASE), key=str)

values = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["1e999", "-1", "0", "1e6", "512MiB", "-5GiB", "1e30", "nan", "inf", "ALE/Pong-v5",
                     "MinAtar/Breakout-v1", "Pendulum-v1", "NoSuchEnv-v0", "../../x", "a/b", "qat", "", "\t"]),
    st.lists(st.integers(min_value=-5, max_value=10**12), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)


def _set(data, path, value, delete=False):
    target = data
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value


structural = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS), values),
    st.tuples(st.just("delete"), st.sampled_from(PATHS), st.none()),
    st.tuples(st.just("unknown"), st.sampled_from([(), ("train",), ("env",), ("eval",), ("variants", 0)]), st.text(min_size=1, max_size=8)),
)

raw_edits = st.one_of(
    st.tuples(st.just("insert"), st.integers(min_value=0, max_value=2000), st.sampled_from([":", "{", "]", "- ", "\t", "&a", "*a", "!!python/object:os.system", "'", "%YAML 9\n", "---\n"])),
    st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=2000), st.none()),
    st.tuples(st.just("bytes"), st.integers(min_value=0, max_value=2000), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("replace"), st.just(0), st.sampled_from([
        "a: &a [*a]\n",
        "a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
        "- just\n- a list\n", "42\n", "", "\x00\x01", "env: !!binary aGVsbG8=\n", "[" * 5000,
    ])),
)


def _mutate(structural_edits, raw_edit) -> bytes:
    data = copy.deepcopy(BASE)
    for op, path, arg in structural_edits:
        try:
            if op == "set":
                _set(data, path, arg)
            elif op == "delete":
                _set(data, path, None, delete=True)
            else:
                target = data
                for key in path:
                    target = target[key]
                if isinstance(target, dict):
                    target[arg] = 1
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed or retyped the parent: the edit lands nowhere
    text = yaml.safe_dump(data, sort_keys=False).encode("utf-8")
    if raw_edit is None:
        return text
    op, at, arg = raw_edit
    at = min(at, len(text))
    if op == "insert":
        return text[:at] + arg.encode() + text[at:]
    if op == "truncate":
        return text[:at]
    if op == "bytes":
        return text[:at] + arg + text[at:]
    return arg.encode("utf-8", "surrogatepass")


def _check_one_line_error(result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output


COUNT = {"cases": 0, "refused": 0}


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(structural_edits=st.lists(structural, max_size=3), raw_edit=st.one_of(st.none(), raw_edits))
def _check_mutated_recipe(tmp_path_factory, structural_edits, raw_edit):
    work = tmp_path_factory.mktemp("fuzz")
    recipe = work / "recipe.yaml"
    recipe.write_bytes(_mutate(structural_edits, raw_edit))
    runner = CliRunner()
    checked = runner.invoke(main, ["validate", str(recipe)])
    _check_one_line_error(checked)
    COUNT["cases"] += 1
    if checked.exit_code == 2:
        COUNT["refused"] += 1
        out = work / "run"
        ran = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
        _check_one_line_error(ran)
        assert ran.exit_code == 2 and not Path(out).exists(), ran.output


def test_a_thousand_mutated_recipes_never_crash_and_most_are_refused(tmp_path_factory):
    # One test runs the fuzz and checks its counts, so the counts prove the property was exercised
    # wherever the test runs (a separate counting test could land on another xdist worker and skip).
    COUNT.update(cases=0, refused=0)
    _check_mutated_recipe(tmp_path_factory)
    print(f"fuzz: {COUNT['cases']} mutated recipes, {COUNT['refused']} refused with exit 2, 0 tracebacks")
    assert COUNT["cases"] >= 1000
    assert COUNT["refused"] >= 500
