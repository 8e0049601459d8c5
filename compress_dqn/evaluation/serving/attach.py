"""GPU serving figures attached to a run: `bench --device gpu` files copied in, results.json's gpu_serving rebuilt.

Why apart from the run: these figures come from another machine than the run's, later, and only
where one was lent. A run holds each attached file as gpu/POLICY.json (`report RUN --gpu FILE` copies
it there); results.json's gpu_serving block is rebuilt from those files (section.py words them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import SCHEMA_VERSION, RunResults, load_results, save_results
from compress_dqn.evaluation.serving.figures import ServingBench
from compress_dqn.fileio import write_text_atomic


def read_bench(path: Path) -> ServingBench:
    """A `bench --device` JSON file, or a one-line UserError naming what is wrong."""
    try:
        return ServingBench.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror}; pass the file `bench POLICY.onnx --device gpu --out FILE` wrote") from None
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"]) or "its top level"
        raise UserError(f"{path}: not a `bench --device` file ({where}: {exc.errors()[0]['msg']}); "
                        "pass the file `bench POLICY.onnx --device gpu --out FILE` wrote") from None


def attached(folder: Path, names: Sequence[str]) -> list[ServingBench] | None:
    """The benches a run holds in `folder`, in the run's policy order; those of policies it no longer has are left out."""
    found = {b.policy: b for b in map(read_bench, sorted(Path(folder).glob("*.json")))} if Path(folder).is_dir() else {}
    benches = [found[name] for name in names if name in found]
    return benches or None


def attach(results_path: Path, folder: Path, files: Sequence[Path]) -> None:
    """Copy each file into the run (folder/POLICY.json, replacing an earlier one) and rebuild results.json's GPU block."""
    if not Path(results_path).is_file():
        raise UserError(f"{results_path.parent}: no results.json; attach GPU figures to a finished run")
    results = load_results(results_path)
    if not isinstance(results, RunResults):
        raise UserError(f"{results_path.parent}: a run of several seeds; attach GPU figures to one seed's run (seed-N/)")
    names = [v.name for v in results.variants]
    for path in files:
        bench = read_bench(path)
        if not bench.on_gpu:
            raise UserError(f"{path}: measured with --device {bench.device}, not on a GPU; the report shows GPU figures "
                            "only: measure with bench --device gpu")
        if bench.policy not in names:
            raise UserError(f"{path}: measures policy {bench.policy!r}, which this run does not hold ({', '.join(names)}); "
                            "measure again with --name POLICY")
        write_text_atomic(Path(folder) / f"{bench.policy}.json", bench.model_dump_json(indent=2))
    benches = attached(folder, names)
    if benches != results.gpu_serving:
        results.gpu_serving = benches
        results.schema_version = SCHEMA_VERSION
        save_results(results, results_path)
