import subprocess
import sys

import pydantic
import pytest

from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import ByteSize, load_recipe

from conftest import ROOT, TINY, cli


def write(tmp_path, text: str, name: str = "r.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path, overrides=()):
    with pytest.raises(UserError) as exc:
        load_recipe(path, overrides)
    return str(exc.value)


def test_shipped_recipes_are_valid():
    for path in (ROOT / "recipes").glob("*.yaml"):
        recipe = load_recipe(path)
        assert recipe.name == path.stem


def test_scientific_counts_sizes_and_floats(tmp_path):
    path = write(tmp_path, "env: {id: CartPole-v1}\ntrain: {buffer_size: 1e6, total_timesteps: '5e4', learning_rate: 1e-3}\nreplay: {memory: 256MiB}\n")
    recipe = load_recipe(path)
    assert recipe.train.buffer_size == 1_000_000
    assert recipe.train.total_timesteps == 50_000
    assert recipe.train.learning_rate == pytest.approx(1e-3)
    assert recipe.replay.memory == 256 * 2**20
    assert recipe.name == "r"


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * 2**20), ("1GB", 10**9), ("1.5 GiB", int(1.5 * 2**30)), (4096, 4096), ("100", 100),
])
def test_byte_sizes(text, expected):
    assert pydantic.TypeAdapter(ByteSize).validate_python(text) == expected


@pytest.mark.parametrize("body, fragment", [
    ("train: {gamma: 1.5}", "train.gamma: 1.5 must be <= 1"),
    ("train: {gama: 0.9}", "train.gama: unknown key (did you mean 'gamma'?)"),
    ("train: {batch_size: 0.5}", "train.batch_size: 0.5 is not a whole number"),
    ("train: {batch_size: 0}", "train.batch_size: 0 must be >= 1"),
    ("train: {learning_rate: 0}", "train.learning_rate: 0 must be > 0"),
    ("train: {loss: l1}", "train.loss: 'l1' is not allowed; expected 'huber' or 'mse'"),
    ("train: 5", "train: expected a mapping of keys, got 5"),
    ("replay: {memory: 12XB}", "replay.memory: '12XB' is not a size"),
    ("train: {exploration_initial_eps: 0.1, exploration_final_eps: 0.5}", "epsilon only decays"),
    ("variants: [{name: random, quantize: {mode: float16}}]", "name 'random' is reserved"),
    ("variants: [{name: baseline, quantize: {mode: float16}}]", "name 'baseline' is reserved"),
    ("variants: [{name: q, quantize: {mode: dynamic, action_head: true}}]",
     "variants.0.quantize: action_head applies to mode int8 only, not dynamic; remove it or use mode: int8"),
    ("variants: [{name: q, quantize: {mode: qat, input_scaling: range}}]",
     "variants.0.quantize: input_scaling applies to modes int8 and int16x8 only, not qat; remove it"),
    ("variants: [{name: q, quantize: {mode: int8, input_scaling: range, normalize_input: false}}]",
     "with normalize_input: false there is none: remove one"),
    ("variants: [{name: q, quantize: {mode: int8, input_scaling: minmax}}]",
     "variants.0.quantize.input_scaling: 'minmax' is not allowed; expected 'std' or 'range'"),
])
def test_errors_name_the_key_value_and_what_is_allowed(tmp_path, body, fragment):
    message = error_of(write(tmp_path, f"env: {{id: CartPole-v1}}\n{body}\n"))
    assert fragment in message
    assert "\n" not in message


def test_missing_env_and_bad_yaml_and_bytes(tmp_path):
    assert "env: required key is missing" in error_of(write(tmp_path, "seed: 1\n"))
    assert "YAML syntax error at line 3, column 1" in error_of(write(tmp_path, "env:\n  id: [CartPole\n"))
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"env: {id: \xff\xfe}\n")
    assert "not UTF-8" in error_of(bad)
    assert "no such file" in error_of(tmp_path / "nope.yaml")
    assert "expected a mapping" in error_of(write(tmp_path, "- 1\n- 2\n"))


def test_overlapping_selection_seeds_rejected(tmp_path):
    path = write(tmp_path, "env: {id: CartPole-v1}\ntrain: {eval_interval: 100, eval_seed: 5}\neval: {seed: 0, episodes: 10}\n")
    assert "overlaps eval.seed range" in error_of(path)


def test_candidate_episodes_must_be_fresh(tmp_path):
    """A variant's candidates are picked on episodes nothing else plays: not the evaluation's, not
    the selection's (train.eval_seed..), not the held-out states'."""
    student = "{name: s, student: {net_arch: [4]}, fine_tune: {select_interval: 50, select_episodes: 30}, candidates: "
    base = "env: {id: CartPole-v1}\ntrain: {eval_seed: 1000}\neval: {seed: 0, episodes: 10, max_episodes: 40}\n"
    for candidates, clash in (("{seed: 30}", "eval.seed's [0, 40)"), ("{seed: 1020, episodes: 5}", "train.eval_seed's [1000, 1030)"),
                              ("{seed: 999995, episodes: 10}", "eval.heldout_seed's")):
        message = error_of(write(tmp_path, base + f"variants: [{student}{candidates}}}]\n"))
        assert message.startswith(str(tmp_path)) and "variants.0.candidates.seed: the fresh episodes" in message and "of variant s overlap" in message and clash in message
    load_recipe(write(tmp_path, base + f"variants: [{student}{{seed: 2000, episodes: 50}}}}]\n"))  # apart: fine
    assert "candidates.count: 1 must be >= 2" in error_of(write(tmp_path, base + f"variants: [{student}{{count: 1}}}}]\n"))
    search = "search: {students: [[4]], student: {fine_tune: {select_interval: 50, select_episodes: 30}, candidates: "
    message = error_of(write(tmp_path, base + search + "{seed: 1010}}}\n"))
    assert "search.student.candidates.seed: the fresh episodes [1010, 1210) of the search's students overlap train.eval_seed's" in message
    load_recipe(write(tmp_path, base + search + "{seed: 2000}}}\n"))
    pruned = "search: {students: [], sparsities: [0.9], pruned: {candidates: {seed: 30}}}\n"
    assert "search.pruned.candidates.seed: the fresh episodes [30, 230) of the search's pruned rungs overlap eval.seed's" in error_of(
        write(tmp_path, base + pruned))


def test_overrides(tmp_path):
    recipe = load_recipe(TINY, ["train.gamma=0.5", "seed=3"])
    assert recipe.train.gamma == 0.5 and recipe.seed == 3
    assert "train.gamma: 2 must be <= 1" in error_of(TINY, ["train.gamma=2"])


def test_validate_cli_bad_recipe_exits_2_with_one_line(tmp_path):
    path = write(tmp_path, "env: {id: CartPole-v1}\ntrain: {gamma: 1.5}\n")
    result = cli("validate", str(path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "train.gamma: 1.5 must be <= 1" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_huge_counts_get_the_one_line_error_and_exit_2(tmp_path):
    """train.buffer_size: 1e308 passed the schema and crashed the memory check's message with an
    OverflowError (exit 1); a count that does not fit NumPy's int64 is refused where it is read."""
    from click.testing import CliRunner

    from compress_dqn.cli import main

    for key in ("train.buffer_size", "train.total_timesteps", "eval.episodes", "fine_tune.steps"):
        override = f"{key}=1e308" if key != "fine_tune.steps" else \
            "variants=[{name: s, student: {net_arch: [8]}, fine_tune: {steps: 1e308}}]"
        assert "must be <= 9223372036854775807" in error_of(TINY, [override]), key
    assert load_recipe(TINY, ["train.total_timesteps=9223372036854775807"]).train.total_timesteps == 2**63 - 1
    path = write(tmp_path, "env: {id: CartPole-v1}\ntrain: {buffer_size: 1.0e+308}\n")
    for args in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path / "never")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "train.buffer_size: 1e+308 must be <= 9223372036854775807" in result.stderr
    assert not (tmp_path / "never").exists()


def test_byte_sizes_too_large_for_a_float_still_format():
    from compress_dqn.replay.budget import format_bytes

    assert format_bytes(1536) == "1.50 KiB" and format_bytes(3 * 2**40) == "3.00 TiB"
    assert format_bytes(10**308 * 7000).endswith(" TiB")  # int too large to convert to float
    assert format_bytes(2**1100) == f"{2**1060} TiB"


def test_validate_and_help_do_not_import_tensorflow():
    code = (
        "import sys, time; t=time.process_time()\n"
        "from compress_dqn.cli import main\n"
        "for args in (['--help'], ['validate', sys.argv[1]]):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), e.code\n"
        "print('TF', 'tensorflow' in sys.modules, time.process_time() - t)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(TINY)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    flag, seconds = result.stdout.strip().splitlines()[-1].split()[1:]
    assert flag == "False"
    assert float(seconds) < 3.0  # CPU seconds, not wall time (a loaded machine stretches the latter): ~0.5 s


def test_validate_cli_reports_env_and_replay_size():
    result = cli("validate", str(TINY))
    assert result.returncode == 0, result.stderr
    assert "CartPole-v1" in result.stdout and "replay 1000 transitions" in result.stdout


def test_validate_rejects_unknown_env(tmp_path):
    result = cli("validate", str(write(tmp_path, "env: {id: CartPol-v1}\n")))
    assert result.returncode == 2
    assert "did you mean CartPole-v1" in result.stderr


def test_an_excluded_layer_the_network_does_not_have_is_refused_before_training(tmp_path):
    """The typo was found only after the baseline had trained; the names of a network the recipe
    builds are known up front (conv_i, hidden_i, q_values), a student's from its own net_arch."""
    path = tmp_path / "r.yaml"
    path.write_text("env: {id: CartPole-v1}\ntrain: {net_arch: [16, 16]}\nvariants:\n"
                    "  - {name: p, prune: {sparsity: 0.5, exclude: [hidden_0, q_values]}}\n"
                    "  - {name: s, student: {net_arch: [8]}, cluster: {clusters: 4, exclude: [hidden_1]}}\n")
    with pytest.raises(UserError, match=r"variants\.1\.cluster\.exclude: no layer named hidden_1 in s's network; "
                                         r"its layers are hidden_0, q_values"):
        load_recipe(path)
    path.write_text(path.read_text().replace("hidden_1]", "hidden_0]"))
    assert [v.name for v in load_recipe(path).variants] == ["p", "s"]


def test_a_clustered_fine_tune_of_its_own_is_refused_where_nothing_is_distilled_first(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("env: {id: CartPole-v1}\nvariants:\n  - {name: c, cluster: {clusters: 4, steps: 100}}\n")
    with pytest.raises(UserError, match=r"variants\.0: .*cluster\.steps and cluster\.learning_rate tune a student"):
        load_recipe(path)
    path.write_text(path.read_text().replace("cluster:", "student: {net_arch: [8]}, cluster:"))
    assert load_recipe(path).variants[0].cluster.steps == 100


def test_low_bit_kernels_are_refused_outside_qat_at_eight_bits_and_with_preserving_qat(tmp_path):
    path = tmp_path / "r.yaml"
    cases = [("{mode: int8, kernel_bits: {hidden_0: 4}}", "", "kernel_bits applies to mode qat only"),
             ("{mode: qat, kernel_bits: {hidden_0: 8}}", "", r"kernel_bits\.hidden_0"),
             ("{mode: qat, kernel_bits: {hidden_0: 4}}", ", cluster: {clusters: 4}", "kernel_bits has no .*preserving QAT")]
    for quantize, extra, message in cases:
        path.write_text(f"env: {{id: CartPole-v1}}\nvariants:\n  - {{name: q, quantize: {quantize}{extra}}}\n")
        with pytest.raises(UserError, match=message):
            load_recipe(path)
    path.write_text("env: {id: CartPole-v1}\nvariants:\n  - {name: q, quantize: {mode: qat, kernel_bits: {hidden_0: 4}}}\n")
    assert load_recipe(path).variants[0].quantize.kernel_bits == {"hidden_0": 4}


def test_validate_warns_about_what_is_valid_but_will_not_work_here(tmp_path):
    from click.testing import CliRunner

    from compress_dqn.cli import main

    path = tmp_path / "r.yaml"
    path.write_text("env: {id: CartPole-v1}\ntrain: {total_timesteps: 1000, learning_starts: 5000, buffer_size: 1e13}\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and result.stdout.startswith("ok: ")
    assert "warning: on this machine, this run needs about" in result.stderr
    assert "warning: train.learning_starts (5000) is not below train.total_timesteps (1000)" in result.stderr


def test_compress_presets_carry_selection_dagger_and_best_of_builds_where_the_task_allows():
    from compress_dqn.recipe.presets import VARIANT_PRESETS, preset_for, search_defaults
    from compress_dqn.recipe.schema import recipe_from_data

    student = preset_for("student-32x32-qat-int8", ["q_values"])
    assert student["fine_tune"]["select_interval"] and student["fine_tune"]["student_states"]
    assert student["candidates"]["count"] > 1 and student["fine_tune"]["learning_rate_schedule"] == "linear"
    assert "student_states" not in preset_for("prune-80", ["q_values"], flat_observations=False)["fine_tune"]
    assert preset_for("prune-80", ["q_values", "hidden_0"])["prune"]["exclude"] == ["q_values", "hidden_0"]
    assert "student_states" not in search_defaults(flat_observations=False)["student"]["fine_tune"]
    assert "student_states" in VARIANT_PRESETS["prune-80"]["fine_tune"]  # the shared table is not edited
    # Every preset and the search defaults validate as a recipe.
    data = {"env": {"id": "CartPole-v1"}, "baseline": {"from": "m.keras"},
            "variants": [{"name": n, **preset_for(n, ["q_values"])} for n in VARIANT_PRESETS],
            "search": {"students": [[8]], **search_defaults()}}
    recipe_from_data(data, "presets")


def test_set_reaches_a_variant_by_name():
    from compress_dqn.errors import UserError
    from compress_dqn.recipe.schema import recipe_from_data

    data = {"env": {"id": "CartPole-v1"}, "variants": [{"name": "a", "quantize": {"mode": "int8"}}, {"name": "b"}]}
    recipe = recipe_from_data(data, "r", ("variants.b.quantize.mode=dynamic",))
    assert [v.quantize.mode if v.quantize else None for v in recipe.variants] == ["int8", "dynamic"]
    with pytest.raises(UserError, match="no variant named 'c'"):
        recipe_from_data(data, "r", ("variants.c.quantize.mode=dynamic",))
