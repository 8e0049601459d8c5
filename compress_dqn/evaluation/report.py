"""Turn results.json into results.csv, report.md, a self-contained report.html and PNG plots.

The headline a reader needs first: which variant is smallest (or fastest) while keeping the
baseline's return, and by how much. What the headline says is computed in evaluation.findings;
this module words it. The table's columns are one list (columns.py's COLUMNS) that the markdown, the
HTML page and the CSV all read. Pure data in, files out; no TensorFlow.
"""

from __future__ import annotations

import base64
import csv
import html
import io
from collections.abc import Sequence
from pathlib import Path

from compress_dqn.errors import UserError
from compress_dqn.evaluation import findings as find
from compress_dqn.evaluation.columns import (COLUMNS, Column, at_one_short, at_one_state, csv_columns, kib,
                                             percent, rows, table_columns)
from compress_dqn.evaluation.figures import M0PLUS, M4F, ONE_PERCENT
from compress_dqn.evaluation.diagnosis import Diagnosis
from compress_dqn.evaluation.findings import Findings, findings, pareto_front
from compress_dqn.evaluation.plots import make_plots, verdict_color
from compress_dqn.evaluation.reasons import REASONS_NOTE, diagnosed_variants, reason_lines
from compress_dqn.evaluation.serving import section as gpu_section
from compress_dqn.evaluation.results import RunResults, SeedsResults, TrainFigures, VariantResult, load_results
from compress_dqn.evaluation.search_section import render_search_markdown
from compress_dqn.evaluation.verdicts import keeps_return
from compress_dqn.fileio import write_bytes_atomic, write_text_atomic

__all__ = ["COLUMNS", "Column", "NO_VARIANTS", "csv_columns", "headline", "kib", "pareto_front",
           "render_aggregate_markdown", "render_html", "render_markdown", "render_search_markdown", "rows", "table_columns",
           "write_report"]


def _times(ratio: float) -> str:
    """'60x smaller', '1.3x smaller', '1.2x larger': a ratio below 10 keeps a decimal, below 1 turns around."""
    if ratio < 1:
        return f"{1 / ratio:.1f}x larger"
    return f"{ratio:.0f}x smaller" if ratio >= 10 else f"{ratio:.1f}x smaller"


NO_VARIANTS = "No variants: the recipe lists none, so this run trained and evaluated the baseline only."


def _keeper_lines(found: Findings) -> list[str]:
    """The smallest and the fastest of the policies that keep the return, against the baseline."""
    base, small = found.baseline, found.smallest
    within = f" within {percent(found.wide_tolerance)} of its lead" if found.wide_tolerance else ""
    at_one = find.at_one_percent(small)
    lines = [
        f"Smallest policy that keeps the baseline's return{within}: {small.name}, "
        f"{small.size.tflite_gzip_bytes:,} bytes gzipped, {_times(base.size.tflite_gzip_bytes / small.size.tflite_gzip_bytes)} "
        f"than the fp32 baseline's {base.size.tflite_gzip_bytes:,} gzipped bytes "
        f"({_times(base.size.tflite_bytes / small.size.tflite_bytes)} raw to raw), return {small.returns.mean:.1f} "
        f"vs the baseline's {find.baseline_same_episodes(small):.1f} on the same {small.episodes} episodes "
        f"({small.label})" + (f"; at 1%: {at_one_state(at_one, small.episodes)}." if at_one else ".")
    ]
    if found.speed is not None:
        fast = found.speed.fastest
        if found.speed.faster:
            fast_at_one = find.at_one_percent(fast)
            fastest_within = f" (within {percent(found.wide_tolerance)})" if found.wide_tolerance else ""
            lines.append(
                f"Fastest{fastest_within}: {fast.name}"
                + (f" (at 1%: {at_one_short(fast_at_one)})" if fast_at_one else "")
                + f", {find.tflite_p50(fast):.1f} us per action (TFLite, batch 1, p50) vs "
                f"{find.tflite_p50(base):.1f} us for the fp32 TFLite baseline and "
                f"{find.saved_model_p50(base):.0f} us through TensorFlow."
            )
        else:
            lines.append(
                f"None of the policies that keep the return is faster than the fp32 TFLite baseline "
                f"({find.tflite_p50(base):.1f} us per action, batch 1, p50; the quickest of them, {fast.name}, "
                f"{find.tflite_p50(fast):.1f} us)."
            )
    return lines


def _c_line(v: VariantResult) -> str:
    """The keeper that takes least flash as generated C: its measured flash and RAM on each Cortex-M target, its form."""
    (flash, ram), m0, form = find.c_flash_ram(v, M4F), find.c_flash_ram(v, M0PLUS), v.c_policy.form
    return (f"Smallest as C with no runtime (`export --target c`) of the policies that keep the return: {v.name}{f' ({form} weights)' if form else ''}, "
            f"{kib(flash)} of flash and {kib(ram)} of RAM on a Cortex-M4F"
            + (f" ({kib(m0[0])} and {kib(m0[1])} on a Cortex-M0+)" if m0 else "") + ", the whole image measured.")


def _winner_line(found: Findings) -> str:
    """The search winner; beside a tolerance wider than 1%, that tolerance and the winner's verdict at 1% on this seed."""
    if not found.wide_tolerance:
        return (f"Search winner (smallest by {found.search_objective} within tolerance on every training "
                f"seed): {found.search_winner}.")
    winner = found.search_winner_policy
    at_one = find.at_one_percent(winner) if winner is not None else None
    return (f"Search winner (smallest by {found.search_objective} within {percent(found.wide_tolerance)} of the "
            f"baseline's lead on every training seed): {found.search_winner}"
            + (f"; at 1% on this seed: {at_one_state(at_one, winner.episodes)}." if at_one else "."))


def headline(results: RunResults) -> list[str]:
    """The findings a reader should see first, as sentences."""
    found = findings(results)
    base = found.baseline
    lines = []
    if found.weak_baseline:
        lines.append(
            f"Warning: the baseline ({base.returns.mean:.1f}) does not beat a uniform-random policy "
            f"({found.random_mean:.1f}), so the tolerance has no scale (a margin of 0) and no "
            "verdict says the compression kept anything worth keeping; train a stronger baseline first."
        )
    lines.append(
        f"Baseline return {base.returns.mean:.1f} over {base.episodes} episodes; a uniform-random policy gets "
        f"{found.random_mean:.1f} on the same episodes (the 0% of normalized scores)."
    )
    if found.smallest is not None:
        lines += _keeper_lines(found)
    else:
        kept = f"No variant kept the baseline's return within {percent(found.wide_tolerance)} of its lead" \
            if found.wide_tolerance else "No variant kept the baseline's return"
        lines.append(f"{kept} (see the verdicts below)." if found.has_variants else NO_VARIANTS)
    if found.worse:
        tolerance = f"the {percent(found.wide_tolerance)} tolerance" if found.wide_tolerance else "the tolerance"
        lines.append(f"Worse than {tolerance}: {', '.join(found.worse)}.")
    if found.undecided:
        names = [u.name + (f" (~{u.episodes_to_decide:,} would decide it)" if u.episodes_to_decide else "")
                 for u in found.undecided]
        why = (" (paired episodes, if the mean difference and its spread hold)"
               if any(u.episodes_to_decide for u in found.undecided) else "")
        lines.append(f"Not decided within {results.eval.max_episodes} episodes: {', '.join(names)}{why}. To decide "
                     "them, raise eval.max_episodes (compress and search: --max-episodes) and rerun on the same "
                     "directory: the episodes already played are kept.")
    if found.micro_fit is not None:
        fit, kb = found.micro_fit, found.micro_fit.budget // 1024
        lines.append(
            f"Fits a microcontroller with {kb} KB of RAM and {kb} KB of flash: {fit.count} "
            f"{'policy that keeps' if fit.count == 1 else 'policies that keep'} the return, smallest {fit.best.name} "
            f"(RAM: {find.micro_arena(fit.best):,} B tensor arena with margin; flash: {find.micro_flash(fit.best):,} B "
            f"model + ~{fit.runtime_bytes // 1024} KB of TFLite Micro's own code with a keyword model's kernels, its "
            "original README's figure; 9,732 B without kernels, its memory_footprint README)"
            + find.float_heads_note(fit.best))
    if found.c_smallest is not None:
        lines.append(_c_line(found.c_smallest))
    if found.search_winner:
        lines.append(_winner_line(found))
    if found.serving_memory is not None:
        memory = found.serving_memory
        lines.append(
            f"Serving memory: a TFLite policy process peaks at {memory.tflite_peak_rss / 2**20:.0f} MiB; "
            f"the same policy through TensorFlow at {memory.saved_model_peak_rss / 2**20:.0f} MiB."
            + (" TensorFlow's figure is probed for the baseline only (measure.saved_model_memory: baseline)."
               if memory.baseline_only else "")
        )
    return lines


def _cells(v: VariantResult, results: RunResults) -> list[tuple[Column, str]]:
    return [(c, c.text(v, results)) for c in table_columns(results)]


def _notes(results: RunResults) -> list[str]:
    ev = results.eval
    random, base, looks = results.random.returns.mean, results.baseline.returns.mean, ev.looks
    sequential = (
        f" While a verdict was inconclusive, that variant (with the baseline and the random policy) played more "
        f"episodes, at looks {', '.join(map(str, looks))}; each CI is at {ev.confidence:.2%} so the {len(looks)} "
        "looks keep each verdict's error rate at 5% (per variant: across many variants, the chance that one "
        "of them is wrong is higher)." if len(looks) > 1 else ""
    )
    margins = sorted(v.return_vs_baseline.margin for v in results.variants[1:] if v.return_vs_baseline)
    margin_text = ("" if not margins else f", a margin of -{margins[0]:.2f}" + (
        f" to -{margins[-1]:.2f} (each on the variant's own episodes)" if margins[-1] - margins[0] >= 0.005 else ""))
    notes = [
        f"Every variant plays the baseline's episode seeds (from {ev.seed}), so differences are paired. The verdict "
        f"is a non-inferiority test: 'within {100 * ev.tolerance:g}%' means the {ev.confidence:.2%} bootstrap CI "
        f"of the per-episode difference stays above -{100 * ev.tolerance:g}% of the baseline's lead over a "
        f"uniform-random policy ({base:.1f} vs {random:.1f} on the same episodes){margin_text}; 'better' means it is "
        f"above 0, 'worse' below the margin, 'inconclusive' neither. The CI's lower end counts one more episode that "
        "loses the baseline's whole lead (or the largest loss seen) times the share of episodes whose returns were "
        "identical: a bootstrap cannot see a rare failure it has not sampled, so identical episodes decide 'within' "
        "only once there are enough of them to make such a failure rare (~400 at 1%). 'Episodes (differed)': how many were played, and on how many the returns differed. "
        f"'vs baseline' is paired: the baseline's mean on the variant's own episodes.{sequential}",
        "Normalized score: (return - random) / (baseline - random) on the variant's episodes; 100% is the baseline.",
        f"Agreement is the share of greedy actions equal to the baseline's on {ev.heldout_episodes} held-out episodes "
        f"(seeds {ev.heldout_seed}..), which no calibration, fine-tune or return evaluation used; a policy can keep "
        "its return with low agreement where actions are near-tied. 'Decisive' is the same share on the half of "
        "those states where the baseline's gap between its best and second-best Q-value is largest.",
        "Gzip is where sparsity shows: a pruned TFLite file is about as large as a dense one until compressed; "
        "size ratios compare gzip to gzip.",
        "MCU arena: the tensor arena TensorFlow Lite Micro needs for the policy, measured with its interpreter, "
        "plus a 25% margin (at least 1 KiB); the model's flash is the .tflite's size, and TFLite Micro's own code "
        "adds 9,732 B of flash without any kernel (its memory_footprint README, Cortex-M3) to about 22 KB with a "
        "keyword model's kernels (its original README); not measured here (`export --target c` measures a policy's "
        "whole image). A 'fits' line counts the arena with margin against RAM and the model plus 22 KB against "
        "flash. '-' where it does not run there (results.json's micro.reason says why).",
    ]
    notes += _at_one_notes(results)
    notes += _c_notes(results)
    if results.gpu and results.gpu != "visible":
        notes.append(f"GPU figures: {results.gpu}.")
    return _baseline_notes(results.train, results) + notes + _candidate_notes(results)


def _at_one_notes(results: RunResults) -> list[str]:
    """Beside a tolerance wider than 1%: each variant's verdict at 1%, from the same CI on the same episodes."""
    states = [(v, at) for v in results.variants[1:] if (at := find.at_one_percent(v)) is not None]
    if not states:
        return []
    margins = sorted(at.margin for _, at in states)
    margin = f"-{margins[0]:.2f}" + (f" to -{margins[-1]:.2f}" if margins[-1] - margins[0] >= 0.005 else "")
    return [f"At 1%: each verdict against a margin of 1% of the baseline's lead ({margin}) instead of "
            f"{percent(results.eval.tolerance)}, from the same CI on the same episodes (none played for it): "
            + "; ".join(f"{v.name} {at_one_state(at, v.episodes)}" for v, at in states) + "."]


def _c_notes(results: RunResults) -> list[str]:
    """What the C columns count, or (a run measured without the `c` extra) why there are none."""
    if results.c_policy_note:
        return [f"{results.c_policy_note}."]
    records = [v.c_policy for v in results.variants if v.c_policy is not None]
    counts = next((c.counts for c in records if c.flash_bytes), None)
    if counts is None:
        return [f"No C flash / RAM: {records[0].reason}"] if records else []
    return [f"C M0+ / M4F flash / RAM: the policy as generated C with no runtime (`export --target c` writes it), "
            f"measured on Cortex-M0+ and Cortex-M4F: {counts}. Unlike TFLite Micro's figures (the arena; the model "
            "array, with the runtime's code not counted), these count the whole image that acts: code, constants, "
            "buffers and stack. '-' where the C export does not translate the policy or its image did not build "
            "(results.json's c_policy.reason says why)."]


def _baseline_notes(train: TrainFigures, results: RunResults) -> list[str]:
    """How the baseline came to be: trained here (how long, which weights kept) or brought (from where, checked how)."""
    source = train.source
    if source is None:
        if train.env_steps is None:
            return []
        kept = (f"; kept the weights of step {train.selected_step:,} (periodic evaluation {train.selected_eval_return:.1f})"
                if train.selected_step is not None else "; kept the last weights")
        return [f"Baseline: trained {train.env_steps:,} environment steps in {train.wall_seconds:.0f} s{kept}."]
    data = source.data
    how = (f"a {data.steps}-step epsilon={data.epsilon} rollout of it" if data.kind == "rollout"
           else f"{data.transitions} transitions from {data.path}")
    notes = [f"Baseline: not trained here but loaded from {source.from_} (SHA-256 "
             f"{(source.sha256 or '?')[:12]}...); calibration, distillation and fine-tuning used {how}."]
    if results.port_check is not None:
        notes.append(results.port_check.summary())
    return notes


_TEACHERS = {"baseline": "the baseline", "float": "its own float weights"}


def _candidate_notes(results: RunResults) -> list[str]:
    """One line per variant built as the best of several candidates: what each scored, which was kept."""
    notes = []
    for v in results.variants:
        picked = v.compression.candidates if v.compression is not None else None
        if picked is None:
            continue
        scores = ", ".join(f"{d:+.1f}" for d in picked.fresh_differences)
        kept = picked.builds[picked.picked] if picked.builds else f"build {picked.picked}"
        teachers = (f" ({picked.count} float builds, each QAT'd to "
                    f"{' and to '.join(_TEACHERS.get(t, t) for t in picked.qat_teachers)})" if picked.qat_teachers else "")
        notes.append(f"{v.name}: the best of {len(picked.fresh_differences)} builds{teachers} by their paired "
                     f"difference from the baseline on {picked.episodes} fresh episodes (seeds {picked.seed}.., used by "
                     f"nothing else): {scores}; kept {kept}. Its verdict comes from the evaluation episodes, not these.")
    return notes


def render_markdown(results: RunResults, plots: Sequence[str], diagnosed: Sequence[Diagnosis] = ()) -> str:
    lines = [f"# compress-dqn report: {results.env_id}", ""]
    lines += [f"- **{line}**" for line in headline(results)] + [""]
    if reasons := reason_lines(results, diagnosed):
        lines += ["## Why variants lost the return", "", *[f"- {line}" for line in reasons], "", REASONS_NOTE, ""]
    table = table_columns(results)
    lines.append("| " + " | ".join(c.header for c in table) + " |")
    lines.append("|" + "---|" * len(table))
    lines += ["| " + " | ".join(text for _, text in _cells(v, results)) + " |" for v in results.variants]
    lines.append("")
    lines += [f"![{name}]({name})" for name in plots] + gpu_section.markdown(results)
    lines += ["", "Notes:", ""] + [f"- {note}" for note in _notes(results)]
    return "\n".join(lines) + "\n"


def render_html(results: RunResults, plots: dict[str, bytes], diagnosed: Sequence[Diagnosis] = ()) -> str:
    """One self-contained page: headline, table, plots embedded as data URIs."""
    esc = html.escape
    head = "".join(f"<li>{esc(line)}</li>" for line in headline(results))
    header = "".join(f"<th>{esc(c.header)}</th>" for c in table_columns(results))
    body = ""
    for v in results.variants:
        color = verdict_color(v.verdict)
        tds = "".join(f'<td style="color:{color};font-weight:600">{esc(text)}</td>' if c.colored else f"<td>{esc(text)}</td>"
                      for c, text in _cells(v, results))
        body += f"<tr>{tds}</tr>"
    images = "".join(
        f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></figure>'
        for name, data in plots.items()
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in _notes(results))
    reasons = reason_lines(results, diagnosed)
    why = (f"<h2>Why variants lost the return</h2><ul>{''.join(f'<li>{esc(r)}</li>' for r in reasons)}</ul>"
           f"<p>{esc(REASONS_NOTE)}</p>" if reasons else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>compress-dqn: {esc(results.env_id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1400px; padding: 0 1rem; color: #222; }}
.wide {{ overflow-x: auto; }}
.headline {{ background: #f3f7fb; border-left: 4px solid #4575b4; padding: 0.6rem 1.2rem; font-size: 1.05rem; }}
table {{ border-collapse: collapse; font-size: 0.85rem; margin: 1rem 0; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
th {{ background: #fafafa; }}
figure {{ display: inline-block; margin: 0.5rem; }} img {{ max-width: 560px; }}
</style></head><body>
<h1>compress-dqn report: {esc(results.env_id)}</h1>
<ul class="headline">{head}</ul>
{why}<div class="wide"><table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div>
{images}{gpu_section.html_section(results)}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""


def render_aggregate_markdown(results: SeedsResults) -> str:
    """The report of a multi-seed run: IQM over seeds with stratified-bootstrap CIs."""
    seeds = results.seeds
    lines = [
        f"# compress-dqn report: {results.env_id}, {len(seeds)} training seeds",
        "",
        f"Each seed's full report is in seed-N/report.html. Returns are the interquartile mean (IQM) over "
        f"seeds {seeds} of each seed's mean return (over {results.eval.episodes} episodes, or more where a "
        "verdict needed them: the number is next to each verdict), with 95% "
        "stratified-bootstrap CIs (Agarwal et al., 2021); the difference is taken per seed against that "
        "seed's own baseline, paired on the episodes the variant played."
        + (f" With {len(seeds)} seeds the IQM trims nothing (it is the mean) and the CI spans about the lowest to the "
           "highest seed: read it as the seeds' range, not as a 95% interval." if len(seeds) < 4 else ""),
        "",
        "| variant | IQM return | 95% CI | IQM difference vs baseline | 95% CI | per-seed mean returns | "
        "per-seed verdicts (episodes) | gzipped bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in results.aggregate:
        at_one = a.per_seed_at_one_percent or [None] * len(a.per_seed_verdict)
        verdicts = ", ".join(f"{v} ({n}" + (f"; at 1%: {at_one_short(at)})" if at else ")")
                             for v, n, at in zip(a.per_seed_verdict, a.per_seed_episodes, at_one))
        lines.append(
            f"| {a.name} | {a.iqm_return:.1f} | [{a.iqm_return_ci95[0]:.1f}, {a.iqm_return_ci95[1]:.1f}] | "
            f"{a.iqm_difference_vs_baseline:+.1f} | [{a.difference_ci95[0]:.1f}, {a.difference_ci95[1]:.1f}] | "
            f"{', '.join(f'{x:.1f}' for x in a.per_seed_mean_return)} | {verdicts} | {a.tflite_gzip_bytes:,} |"
        )
    kept = [a.name for a in results.aggregate[1:] if all(keeps_return(v) for v in a.per_seed_verdict)]
    if len(results.aggregate) > 1:
        tolerance = results.eval.tolerance or (results.search.tolerance if results.search else None)
        wide = tolerance is not None and tolerance > ONE_PERCENT
        strict = [a.name for a in results.aggregate[1:]
                  if a.per_seed_at_one_percent and all(at and keeps_return(at.verdict) for at in a.per_seed_at_one_percent)]
        lines += ["", f"Within {percent(tolerance) + ' of the lead' if wide else 'tolerance'} on every seed: "
                  f"{', '.join(kept) if kept else 'none'}"
                  + (f"; within 1% on every seed, on the same episodes: {', '.join(strict) or 'none'}." if wide else ".")]
    elif not results.search:
        lines += ["", NO_VARIANTS]
    if results.search:
        lines += [""] + render_search_markdown(results.search)
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path) -> list[Path]:
    """(Re)write results.csv, report.md, report.html and the plots from run_dir/results.json
    (a multi-seed run's report.md only: the per-seed reports live in seed-N/)."""
    run_dir = Path(run_dir)
    source = run_dir / "results.json"
    if not source.is_file():
        raise UserError(f"{run_dir}: no results.json; pass a run directory written by compress-dqn run")
    results = load_results(source)
    if isinstance(results, SeedsResults):
        write_text_atomic(run_dir / "report.md", render_aggregate_markdown(results))
        return [run_dir / "report.md"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([c.key for c in csv_columns(results)])
    writer.writerows([row.values() for row in rows(results)])
    write_text_atomic(run_dir / "results.csv", buffer.getvalue())
    written = [run_dir / "results.csv"]
    plots = make_plots(results)
    for name, data in plots.items():
        write_bytes_atomic(run_dir / name, data)
        written.append(run_dir / name)
    diagnosed = diagnosed_variants(results, run_dir)
    write_text_atomic(run_dir / "report.md", render_markdown(results, list(plots), diagnosed))
    write_text_atomic(run_dir / "report.html", render_html(results, plots, diagnosed))
    return [*written, run_dir / "report.md", run_dir / "report.html"]
