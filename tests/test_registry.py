"""deploy/registry.py: every row names an export function of (policy, out, options) and an availability check
that resolve, and `compress-dqn export`'s --target choices, default and help are the rows' own, built without
importing any target (so a new row is a new target, and `--help` stays light). Milliseconds, and one short
Python start for the import check."""

import inspect
import subprocess
import sys

from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.deploy import registry
from compress_dqn.deploy.base import ExportOptions


def test_every_row_names_an_export_function_of_policy_out_options_and_options_it_knows():
    for target in registry.TARGETS.values():
        export = registry.load_named(target.export_function)
        assert list(inspect.signature(export).parameters)[:3] == ["policy", "out", "options"], target.name
        assert isinstance(target.available(), bool), target.name
        assert target.options <= set(registry.OPTIONS) <= set(ExportOptions.model_fields), target.name


def test_export_help_is_the_tables():
    result = CliRunner().invoke(main, ["export", "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"--target [{'|'.join(registry.TARGETS)}]" in text and f"[default: {registry.DEFAULT}]" in text
    for target in registry.TARGETS.values():
        assert f"{target.name}: {target.help}" in text and target.default_out in text
    for key in registry.OPTIONS:
        assert registry.option_help(key) in text


def test_the_command_line_imports_no_target_to_parse():
    code = ("import sys\nimport compress_dqn.cli\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('compress_dqn.deploy.') or m in ('pydantic', 'onnx', "
            "'ai_edge_litert', 'tflite_micro'))\n"
            "assert loaded == ['compress_dqn.deploy.registry'], loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
