"""The report's columns: one list (COLUMNS) of every figure of a policy that the markdown table, the HTML page
and results.csv all read, with the cells' wording. Pure data; no TensorFlow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compress_dqn.evaluation import findings as find
from compress_dqn.evaluation.figures import M0PLUS, M4F, AtOnePercent, Verdict
from compress_dqn.evaluation.results import RunResults, VariantResult

Value = float | int | str | tuple[float, float] | None


@dataclass(frozen=True)
class Column:
    """One figure of a policy: its CSV column (`key`), its table column (`header`, at `table`: its place
    there, as the table orders figures unlike the CSV), the value, and the table cell's text."""

    key: str | None
    """The CSV's column; None for a table cell that shows figures of other columns."""
    value: Callable[[VariantResult, RunResults], Value]
    header: str | None = None
    """The table's header; None for a figure the CSV alone holds."""
    table: int | None = None
    cell: Callable[[VariantResult, RunResults], str] | None = None
    """The cell's text; by default `fmt` of the value, '-' where it is missing."""
    fmt: str = "{}"
    colored: bool = False
    """The HTML page colours the cell by the policy's verdict."""
    shown: Callable[[RunResults], bool] | None = None
    """Whether a run's table and CSV have the column; None: always. A figure that older runs lack
    (the C policy's) is left out where no policy has it, so their reports re-render as they were."""

    def shows(self, results: RunResults) -> bool:
        return self.shown is None or self.shown(results)

    def text(self, v: VariantResult, results: RunResults) -> str:
        if self.cell is not None:
            return self.cell(v, results)
        value = self.value(v, results)
        if value is None:
            return "-"
        return f"{value / 2**20:.0f}" if self.fmt == "mib" else self.fmt.format(value)


def _ci_cell(v: VariantResult, results: RunResults) -> str:
    """The difference's CI with as many decimals (1-3) as it takes to tell its ends from -margin."""
    (lo, hi), margin = find.difference_ci(v), v.return_vs_baseline.margin if v.return_vs_baseline else None
    digits = 1
    while margin and digits < 3 and any(round(end, digits) == round(-margin, digits) for end in (lo, hi)):
        digits += 1
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def _episodes_cell(v: VariantResult, results: RunResults) -> str:
    """Episodes played, and (for a variant) on how many the returns differed from the baseline's."""
    differing = v.return_vs_baseline.episodes_differing if v.return_vs_baseline else None
    return f"{v.episodes}" if differing is None else f"{v.episodes} ({differing})"


def _opt(get: Callable[[VariantResult], Value]) -> Callable[[VariantResult, RunResults], Value]:
    return lambda v, _results: get(v)


def _has_at_one(results: RunResults) -> bool:
    """Whether the run decided at a tolerance wider than 1%, so its verdicts also have one at 1%."""
    return any(find.at_one_percent(v) is not None for v in results.variants)


def _at_one_field(v: VariantResult, field: str) -> Value:
    at = find.at_one_percent(v)
    return None if at is None else getattr(at, field)


def percent(tolerance: float) -> str:
    return f"{100 * tolerance:g}%"


def at_one_state(at: AtOnePercent, episodes: int) -> str:
    """A verdict at 1% in a sentence: 'within 1% (12,800 episodes)', 'inconclusive (~40,000 episodes would decide it)'."""
    if at.kind is Verdict.INCONCLUSIVE and at.episodes_to_decide:
        return f"inconclusive (~{at.episodes_to_decide:,} episodes would decide it)"
    return f"{at.verdict} ({episodes:,} episodes)"


def at_one_short(at: AtOnePercent) -> str:
    """A verdict at 1% in a table cell: 'within 1%', 'inconclusive, ~40,000 to decide'."""
    return at.verdict + (f", ~{at.episodes_to_decide:,} to decide" if at.episodes_to_decide else "")


def kib(n: int) -> str:
    """Bytes as a reader compares them with a part's datasheet: '236 B', '2.4 KB' (KB = 1,024 B)."""
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB"


def _c_cell(target: str) -> Callable[[VariantResult, RunResults], str]:
    """'2.4 KB / 236 B': the C policy's flash / RAM on `target`, '-' where it has none."""
    def cell(v: VariantResult, _results: RunResults) -> str:
        figures = find.c_flash_ram(v, target)
        return "-" if figures is None else f"{kib(figures[0])} / {kib(figures[1])}"
    return cell


def _c_bytes(target: str, which: int) -> Callable[[VariantResult, RunResults], Value]:
    """The C policy's flash (which=0) or RAM (1) bytes on `target`; None where it has none."""
    def value(v: VariantResult, _results: RunResults) -> Value:
        figures = find.c_flash_ram(v, target)
        return None if figures is None else figures[which]
    return value


COLUMNS: list[Column] = [
    Column("name", _opt(lambda v: v.name), "variant", 0),
    Column("return_mean", _opt(lambda v: v.returns.mean), "return", 1, fmt="{:.1f}"),
    Column("return_std", _opt(lambda v: v.returns.std)),
    Column("return_ci_low", _opt(lambda v: v.returns.ci95[0])),
    Column("return_ci_high", _opt(lambda v: v.returns.ci95[1])),
    Column("diff_mean", _opt(find.difference), "vs baseline", 2, fmt="{:+.1f}"),
    Column(None, _opt(find.difference_ci), "CI of difference", 3, cell=_ci_cell),
    Column("diff_ci_low", _opt(lambda v: find.difference_ci(v)[0])),
    Column("diff_ci_high", _opt(lambda v: find.difference_ci(v)[1])),
    Column("normalized_score", find.normalized_score, "normalized", 6, fmt="{:.1%}"),
    Column("margin", _opt(lambda v: v.return_vs_baseline.margin if v.return_vs_baseline else None)),
    Column("baseline_same_episodes", _opt(find.baseline_same_episodes)),
    Column("episodes", _opt(lambda v: v.episodes), "episodes (differed)", 5, cell=_episodes_cell),
    Column("episodes_differing", _opt(lambda v: v.return_vs_baseline.episodes_differing if v.return_vs_baseline else None)),
    Column("verdict", _opt(lambda v: v.label), "verdict", 4, colored=True),
    Column("episodes_to_decide", _opt(lambda v: find.to_decide(v.return_vs_baseline))),
    Column("verdict_at_1pct", _opt(lambda v: _at_one_field(v, "verdict")), shown=_has_at_one),
    Column("episodes_to_decide_at_1pct", _opt(lambda v: _at_one_field(v, "episodes_to_decide")), shown=_has_at_one),
    Column("action_agreement", _opt(lambda v: v.action_agreement), "agreement", 7, fmt="{:.3f}"),
    Column("action_agreement_decisive", _opt(lambda v: v.action_agreement_decisive), "decisive", 8, fmt="{:.3f}"),
    Column(None, _opt(lambda v: f"{v.size.nonzero_params:,} / {v.size.params:,}"), "nonzero / params", 9),
    Column("params", _opt(lambda v: v.size.params)),
    Column("nonzero_params", _opt(lambda v: v.size.nonzero_params)),
    Column("tflite_bytes", _opt(lambda v: v.size.tflite_bytes), "TFLite bytes", 10, fmt="{:,}"),
    Column("tflite_gzip_bytes", _opt(lambda v: v.size.tflite_gzip_bytes), "gzipped", 11, fmt="{:,}"),
    Column("saved_model_bytes", _opt(lambda v: v.size.saved_model_bytes)),
    Column("tflite_p50_us", _opt(find.tflite_p50), "TFLite p50 us", 12, fmt="{:.1f}"),
    Column("tflite_p99_us", _opt(find.tflite_p99)),
    Column("saved_model_p50_us", _opt(find.saved_model_p50), "TF p50 us", 13, fmt="{:.0f}"),
    Column("tflite_peak_rss", _opt(find.tflite_peak_rss), "TFLite RSS MiB", 14, fmt="mib"),
    Column("saved_model_peak_rss", _opt(find.saved_model_peak_rss), "TF RSS MiB", 15, fmt="mib"),
    Column("micro_flash_bytes", _opt(find.micro_flash)),
    Column("micro_arena_bytes", _opt(find.micro_arena), "MCU arena B", 16, fmt="{:,}"),
    Column(None, _c_bytes(M0PLUS, 0), "C M0+ flash / RAM", 17, cell=_c_cell(M0PLUS), shown=find.has_c_figures),
    Column(None, _c_bytes(M4F, 0), "C M4F flash / RAM", 18, cell=_c_cell(M4F), shown=find.has_c_figures),
    Column("c_m0plus_flash_bytes", _c_bytes(M0PLUS, 0), shown=find.has_c_figures),
    Column("c_m0plus_ram_bytes", _c_bytes(M0PLUS, 1), shown=find.has_c_figures),
    Column("c_m4f_flash_bytes", _c_bytes(M4F, 0), shown=find.has_c_figures),
    Column("c_m4f_ram_bytes", _c_bytes(M4F, 1), shown=find.has_c_figures),
]
"""Every figure of the table and the CSV: the CSV holds those with a key in this order, the table
those with a header in their `table` order (of each, those a run `shows`)."""


def table_columns(results: RunResults) -> list[Column]:
    """The table's columns for this run, in their table order."""
    return sorted((c for c in COLUMNS if c.header is not None and c.shows(results)), key=lambda c: c.table)


def csv_columns(results: RunResults) -> list[Column]:
    """results.csv's columns for this run."""
    return [c for c in COLUMNS if c.key is not None and c.shows(results)]


def rows(results: RunResults) -> list[dict[str, Value]]:
    """One flat row per policy, by CSV column (results.csv)."""
    return [{c.key: c.value(v, results) for c in csv_columns(results)} for v in results.variants]
