"""The report's GPU serving section: the GPU figures attached to a run, worded (attach.py writes them).

The section shows only what the attached files measured, naming the machine the crossover holds for.
"""

from __future__ import annotations

import html
from pathlib import Path

from compress_dqn.evaluation.results import RunResults
from compress_dqn.evaluation.serving.figures import BatchFigures, ServingBench


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.2f} MB" if n < 1e8 else f"{n / 1e9:,.2f} GB"


def _faster(b: BatchFigures) -> str:
    ratio = b.best_cpu.p50_us / b.device_us
    return f"GPU {ratio:.1f}x" if ratio >= 1 else f"CPU {1 / ratio:.1f}x"


def _machine_line(bench: ServingBench) -> str:
    m = bench.machine
    return f"{m.device} ({bench.runtime}) against onnxruntime on its {m.cpu} ({m.cpu_count} threads)"


def _pays(bench: ServingBench) -> str:
    """'baseline from batch 64 (35x at 16,384)', or where the CPU wins throughout."""
    last = bench.batches[-1]
    if bench.crossover_batch is None:
        return f"{bench.policy} nowhere up to batch {last.batch:,} (the CPU is {_faster(last)[4:]} faster there)"
    return f"{bench.policy} from batch {bench.crossover_batch:,} ({_faster(last)[4:]} at {last.batch:,})"


def gpu_headline(benches: list[ServingBench]) -> str:
    """What a GPU buys for these policies, from which batch, on which machine, and the memory it costs."""
    machines = sorted({_machine_line(b) for b in benches})
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
        setup = (f"on {_machine_line(b)}; {b.runtime_note}; states: {b.states}; CUDA context: "
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
    lines = ["", "## GPU serving", "", f"- **{gpu_headline(benches)}**", "", "| " + " | ".join(HEADER) + " |",
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
    return (f'<h2>GPU serving</h2><ul class="headline"><li>{esc(gpu_headline(benches))}</li></ul>'
            f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
            "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in notes(benches)) + "</ul>\n")
