"""The search keys from before the families were templates (prune_exclude, qat_steps, ...), read into them.

Each old key becomes the template setting it meant, so a recipe or a run's recipe.yaml written in
them builds, and names, every rung as before, and a search started then resumes its builds. The
product itself writes only the templates; deleting this module and SearchConfig's one validator
that calls it drops the old keys.
"""

from __future__ import annotations

from typing import Any

from compress_dqn.recipe.quantize import LOW_BIT_WITHOUT_CLUSTERING
from compress_dqn.recipe.templates import PRUNE_DENSE, SEARCH_QAT, StudentTemplate


_OLD_SEARCH_KEYS = ("student_quantize", "student_fine_tune", "student_candidates", "student_cluster",
                    "student_kernel_bits", "prune_exclude", "prune_fine_tune", "prune_quantize", "prune_sparse_format",
                    "qat_steps", "qat_learning_rate", "qat_float_head", "qat_teacher")
"""search: the keys from before the families were templates, read into the templates."""


def _merged(given: Any, value: Any) -> Any:
    """value over what the recipe gives: an --set of an earlier key edits a template the recipe writes."""
    if isinstance(given, dict) and isinstance(value, dict):
        return {**given, **{key: _merged(given.get(key), v) for key, v in value.items()}}
    return value


def _is_qat(quantize: Any) -> bool:
    return isinstance(quantize, dict) and quantize.get("mode") == "qat"


def _search_qat(student_quantize: Any, keys: tuple[str, ...] = ("qat_steps", "qat_learning_rate", "float_head")) -> Any:
    """The QAT the earlier keys (qat_steps, qat_learning_rate, qat_float_head) gave every family: the
    students' where they are QAT'd (a template keeps them there)."""
    if not _is_qat(student_quantize):
        return dict(SEARCH_QAT)
    return {"mode": "qat", **{key: student_quantize[key] for key in keys if key in student_quantize}}


def _quantize(quantize: Any, mode: str | None, old: dict[str, Any], qat: Any = SEARCH_QAT, float_head: bool = True) -> Any:
    """A template's quantize after the earlier keys: mode (student_quantize, prune_quantize; qat as
    the search's QAT) and, on QAT, qat_steps, qat_learning_rate and qat_float_head."""
    if mode == "qat":
        quantize = quantize if _is_qat(quantize) else dict(qat)
    elif mode is not None:
        quantize = None if mode == "none" else {"mode": mode}
    if not _is_qat(quantize):
        return quantize
    keys = {"qat_steps": "qat_steps", "qat_learning_rate": "qat_learning_rate", "qat_float_head": "float_head"}
    return {**quantize, **{keys[k]: old[k] for k in keys if k in old and (float_head or k != "qat_float_head")}}


def _student_from_old_keys(student: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    for key in ("fine_tune", "candidates", "cluster"):
        if f"student_{key}" in old:
            student[key] = _merged(student.get(key), old[f"student_{key}"])
    quantize = _quantize(student.get("quantize", dict(SEARCH_QAT)), old.get("student_quantize"), old)
    bits, teacher = old.get("student_kernel_bits"), old.get("qat_teacher")
    if _is_qat(quantize):
        quantize = {**quantize, **({"kernel_bits": bits} if bits else {}),
                    **({"qat_teacher": teacher} if teacher in ("baseline", "float") else {})}
        if teacher == "both" and isinstance(student.get("candidates"), dict):
            student["candidates"] = {**student["candidates"], "qat_teachers": ["baseline", "float"]}
    elif bits:
        raise ValueError(f"student_kernel_bits: {LOW_BIT_WITHOUT_CLUSTERING}; "
                         "set student_quantize: qat and remove student_cluster, or remove student_kernel_bits")
    if teacher == "both" and not (_is_qat(quantize) and isinstance(student.get("candidates"), dict)):
        raise ValueError("qat_teacher: both makes each QAT build two candidates: it needs student_quantize: qat and "
                         "student_candidates (now written student: {quantize: {mode: qat}, candidates: {qat_teachers: "
                         "[baseline, float]}})")
    return {**student, "quantize": quantize}


def templates_from_old_keys(data: Any) -> Any:
    """The earlier keys (_OLD_SEARCH_KEYS, quantized_baseline: none/int8/qat) as the templates they
    meant: each rung is built, and named, as before, so a search started before resumes its builds."""
    if not isinstance(data, dict):
        return data
    if not (set(_OLD_SEARCH_KEYS) & set(data) or isinstance(data.get("quantized_baseline"), str)):
        return data
    old = {key: data[key] for key in _OLD_SEARCH_KEYS if key in data}
    data = {key: value for key, value in data.items() if key not in old}
    student, pruned = data.get("student", {}), data.get("pruned", {})
    if not (isinstance(student, dict) and isinstance(pruned, dict)):
        return {**data, **old}  # refused as written
    data["student"] = _student_from_old_keys(dict(student), old)
    pruned = dict(pruned)
    if "prune_exclude" in old or "prune_sparse_format" in old:
        prune = dict(pruned.get("prune") or {"exclude": PRUNE_DENSE})
        prune.update({key: old[f"prune_{key}"] for key in ("exclude", "sparse_format") if f"prune_{key}" in old})
        pruned["prune"] = prune
    if "prune_fine_tune" in old:
        pruned["fine_tune"] = _merged(pruned.get("fine_tune"), old["prune_fine_tune"])
    quantize = _quantize(pruned.get("quantize", {"mode": "int8"}), old.get("prune_quantize"), old,
                         _search_qat(data["student"]["quantize"]))
    data["pruned"] = {**pruned, "quantize": quantize}
    baseline = data.get("quantized_baseline")
    if isinstance(baseline, str):  # the whole baseline in QAT: the students' fine-tune, QAT steps and step size
        student = data["student"]
        qat = {"fine_tune": student.get("fine_tune", StudentTemplate().fine_tune.model_dump()),
               "quantize": _search_qat(student["quantize"], ("qat_steps", "qat_learning_rate"))}
        baseline = {"none": None, "int8": {"quantize": {"mode": "int8"}}, "qat": qat}.get(baseline, baseline)
    if isinstance(baseline, dict):
        baseline = {**baseline, "quantize": _quantize(baseline.get("quantize"), None, old, float_head=False)}
    data["quantized_baseline"] = baseline
    return data
