"""GPU serving figures in a run: `bench --device gpu` files attached to it, and the report's GPU section that words them.

Why apart from report.py: these figures come from another machine than the run's, later, and only
where one was lent. A run holds each attached file as gpu/POLICY.json (`report RUN --gpu FILE` copies
it there); results.json's gpu_serving block is rebuilt from those files, and the section shows only
what they measured, naming the machine the crossover holds for.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import SCHEMA_VERSION, RunResults, load_results, save_results
from compress_dqn.evaluation.serving_figures import BatchFigures, ServingBench
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


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.2f} MB" if n < 1e8 else f"{n / 1e9:,.2f} GB"


def _faster(b: BatchFigures) -> str:
    ratio = b.best_cpu.p50_us / b.device_us
    return f"GPU {ratio:.1f}x" if ratio >= 1 else f"CPU {1 / ratio:.1f}x"


def _machine(bench: ServingBench) -> str:
    m = bench.machine
    return f"{m.device} ({bench.runtime}) against onnxruntime on its {m.cpu} ({m.cpu_count} threads)"


def _pays(bench: ServingBench) -> str:
    """'baseline from batch 64 (35x at 16,384)', or where the CPU wins throughout."""
    last = bench.batches[-1]
    if bench.crossover_batch is None:
        return f"{bench.policy} nowhere up to batch {last.batch:,} (the CPU is {_faster(last)[4:]} faster there)"
    return f"{bench.policy} from batch {bench.crossover_batch:,} ({_faster(last)[4:]} at {last.batch:,})"


def headline(benches: list[ServingBench]) -> str:
    """What a GPU buys for these policies, from which batch, on which machine, and the memory it costs."""
    machines = sorted({_machine(b) for b in benches})
    where = machines[0] if len(machines) == 1 else "the machines below"
    contexts = [b.context_bytes for b in benches if b.context_bytes is not None]
    peaks = [(p.peak_bytes, b.policy, p.batch) for b in benches for p in b.batches if p.peak_bytes is not None]
    memory = [f"the CUDA context {_mb(max(contexts))} of GPU memory before any policy"] if contexts else []
    if peaks:
        top = max(peaks)
        memory.append(f"the policies' own allocations at most {_mb(top[0])} ({top[1]} at batch {top[2]:,})")
    return (f"A GPU serves faster than the CPU on {where}: " + "; ".join(map(_pays, benches))
            + (f". It costs {' and '.join(memory)}." if memory else "."))


HEADER = ["policy", "form", "batch", "GPU graph p50 us", "GPU eager p50 us", "CPU p50 us (threads)", "faster",
          "policy's GPU memory", "actions differing"]


def table(benches: list[ServingBench]) -> list[list[str]]:
    """One row per policy and batch; '-' where that figure was not measured."""
    return [[b.policy, b.form, f"{p.batch:,}", _us(p.graph.p50_us) if p.graph else "-", _us(p.eager.p50_us),
             f"{_us(p.best_cpu.p50_us)} ({p.best_cpu.threads})", _faster(p), _mb(p.peak_bytes),
             f"{p.actions_differing:,} / {p.batch:,}"] for b in benches for p in b.batches]


def notes(benches: list[ServingBench]) -> list[str]:
    """How the figures were measured, and what holds where: one line for the policies measured alike."""
    alike: dict[str, list[ServingBench]] = {}
    for b in benches:
        setup = (f"on {_machine(b)}; {b.runtime_note}; states: {b.states}; CUDA context: "
                 f"{_mb(b.context_bytes) if b.context_bytes is not None else b.context_note}"
                 + (f"; no graph figures: {b.graph_note}" if b.graph_note else "")
                 + (f"; GPU memory {b.memory_note}" if b.memory_note else "") + ".")
        alike.setdefault(setup, []).append(b)
    lines = [(f"{group[0].policy}: `compress-dqn bench {Path(group[0].file).name} --device gpu` " if len(group) == 1 else
              f"{', '.join(b.policy for b in group)}: `compress-dqn bench POLICY.onnx --device gpu` each ") + setup
             for setup, group in alike.items()]
    return lines + [
        "p50 of one call with its result waited for (the input already on the GPU); graph: one call captured as a CUDA "
        "graph and replayed; fp32 with TF32 off. CPU: onnxruntime on the same machine at the thread count named (the "
        "faster of one thread and every core). The crossover is the batch from which the GPU wins at every larger batch "
        "measured: it holds for the machine named, its GPU and its CPU, not for another. Actions differing: the GPU's "
        "against onnxruntime's on the CPU (one thread) on the same states."]


def markdown(results: RunResults) -> list[str]:
    """The section's markdown lines; none where no GPU figures are attached."""
    benches = results.gpu_serving
    if not benches:
        return []
    lines = ["", "## GPU serving", "", f"- **{headline(benches)}**", "", "| " + " | ".join(HEADER) + " |",
             "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table(benches)]
    return lines + [""] + [f"- {line}" for line in notes(benches)]


def html_section(results: RunResults) -> str:
    """The section as HTML; empty where no GPU figures are attached."""
    benches = results.gpu_serving
    if not benches:
        return ""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in table(benches))
    return (f'<h2>GPU serving</h2><ul class="headline"><li>{esc(headline(benches))}</li></ul>'
            f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
            "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in notes(benches)) + "</ul>\n")
