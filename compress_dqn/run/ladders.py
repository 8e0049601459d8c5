"""The search's candidates: each family's ladder of variants, and what each rung should weigh.

A rung is the variant it is built as (a distilled student, MLP or CNN, the baseline pruned, or
the whole baseline in int8),
named after its shape, so a search that is rerun with another ladder can tell which of its builds
still stand (run.rundir). Sizes are estimates from the layer shapes, used to order a ladder and to
skip rungs that cannot win, never to decide a winner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from compress_dqn.recipe.schema import Recipe, SearchConfig, StudentConfig, VariantConfig

_BYTES_PER_WEIGHT = {"qat": 1, "int8": 1, "dynamic": 1, "int16x8": 1, "weight_only": 1, "float16": 2, None: 4}
GZIP_FLOOR = 0.5
"""The least a weight byte has been seen to take gzipped: QAT'd int8 conv kernels do not fill a
byte each (a MinAtar student's 16.8k int8 weights gzipped to 10.1 KB, docs/minatar.md), so an
estimate of weight bytes alone is no lower bound of the gzipped file."""


@dataclass
class Candidate:
    """One rung of a family's ladder."""

    family: str
    variant: VariantConfig
    estimated_bytes: float
    """Weight bytes after compression (nonzero weights x bytes per weight): orders a ladder and,
    with GZIP_FLOOR, skips rungs that cannot win; never decides a winner."""
    position_bytes: float = 0.0
    """Where a pruned rung's nonzero weights are: its masks' entropy, n x H(density) bits a pruned
    kernel, which no coder of the file gets below for a mask as random as magnitude pruning leaves
    it (a dense kernel's zeros and a sparse one's indices alike). 0 for a rung that prunes nothing."""

    @property
    def floor_bytes(self) -> float:
        """The least its file may gzip to, as far as the search assumes when it skips a rung: its
        weights at GZIP_FLOOR, and where they are. The Zoo's MountainCar agents' 256x256 baselines
        pruned 90% and 95%, then int8, gzipped to 20,478 B and 14,940 B against floors of 7,558 B
        and 4,399 B (docs/zoo-search.md)."""
        return self.estimated_bytes * GZIP_FLOOR + self.position_bytes

    fallback: Candidate | None = None
    """The same rung in another form (a student's search.student.fallback), played where this one
    is not kept; the rung counts as the better of the two."""


def layer_weights(conv: list[Any], widths: list[int], obs_shape: tuple[int, ...], n_actions: int) -> dict[str, int]:
    """Kernel weights of each layer of a network (conv_i, hidden_i, q_values) on observations of
    obs_shape, 'valid' convolutions as networks.build_q_network lays them out."""
    weights: dict[str, int] = {}
    if conv:
        height, width, channels = obs_shape
        for i, layer in enumerate(conv):
            weights[f"conv_{i}"] = layer.kernel * layer.kernel * channels * layer.filters
            height, width = (height - layer.kernel) // layer.stride + 1, (width - layer.kernel) // layer.stride + 1
            channels = layer.filters
        n_inputs = height * width * channels
    else:
        n_inputs = int(np.prod(obs_shape))
    sizes = [n_inputs, *widths, n_actions]
    names = [f"hidden_{i}" for i in range(len(widths))] + ["q_values"]
    weights.update({name: a * b for name, a, b in zip(names, sizes, sizes[1:])})
    return weights


def _estimate(variant: VariantConfig, train: Any, obs_shape: tuple[int, ...], n_actions: int) -> float:
    network = variant.student or train
    weights = layer_weights(list(network.conv), list(network.net_arch), obs_shape, n_actions)
    if variant.prune:
        weights = {name: w if name in variant.prune.exclude else w * (1 - variant.prune.sparsity)
                   for name, w in weights.items()}
    mode = variant.quantize.mode if variant.quantize else None
    per_weight = {name: _BYTES_PER_WEIGHT[mode] for name in weights}
    # A clustered kernel at log2(clusters) bits a weight, as K equally used values would take.
    # Not a bound: gzip's repeats took a 16-value MinAtar kernel to 2-3.5 bits (docs/minatar.md).
    if variant.cluster:
        per_weight.update({name: min(per_weight[name], np.log2(variant.cluster.clusters) / 8)
                           for name in weights if name not in variant.cluster.exclude})
    if variant.quantize:  # a low-bit kernel as its 2^b-1 values equally used would take
        per_weight.update({name: bits / 8 for name, bits in variant.quantize.kernel_bits.items() if name in weights})
    total = sum(w * per_weight[name] for name, w in weights.items())
    if variant.quantize and variant.quantize.float_head:  # the output layer's weights stay fp32
        total += weights["q_values"] * (_BYTES_PER_WEIGHT[None] - _BYTES_PER_WEIGHT[mode])
    if mode == "weight_only":  # its output layer's in float16 (deploy.tflite.weight_only)
        total += weights["q_values"] * (_BYTES_PER_WEIGHT["float16"] - _BYTES_PER_WEIGHT[mode])
    return float(total)


def _position_bytes(variant: VariantConfig, train: Any, obs_shape: tuple[int, ...], n_actions: int) -> float:
    """Candidate.position_bytes: the entropy of each pruned kernel's mask, in bytes."""
    if not variant.prune or not 0.0 < variant.prune.sparsity < 1.0:
        return 0.0
    network = variant.student or train
    weights = layer_weights(list(network.conv), list(network.net_arch), obs_shape, n_actions)
    density = 1.0 - variant.prune.sparsity
    bits = -(density * np.log2(density) + (1 - density) * np.log2(1 - density))
    return float(sum(w * bits / 8 for name, w in weights.items() if name not in variant.prune.exclude))


def student_name(student: StudentConfig) -> str:
    """student-32x32 for an MLP; student-c8k3-32 for 8 3x3 filters then 32 units (s2: stride 2);
    shrink-gap-32x32 for the baseline narrowed to that shape, its units ranked by the action gap."""
    convs = [f"c{c.filters}k{c.kernel}" + (f"s{c.stride}" if c.stride != 1 else "") for c in student.conv]
    start = ["shrink", student.from_teacher] if student.from_teacher else ["student"]
    return "-".join([*start, *convs, "x".join(map(str, student.net_arch))])


_CONV = re.compile(r"c(\d+)k(\d+)(?:s(\d+))?")


def parse_student(text: str) -> list[int] | StudentConfig:
    """The inverse of student_name without its prefix: 64x64 (an MLP's widths) or c8k3-32 (conv
    layers, then widths) as a search.students entry. ValueError if it is neither."""
    *convs, widths = text.split("-")
    matches = [_CONV.fullmatch(c) for c in convs]
    net_arch = [int(w) for w in widths.split("x")]  # ValueError on anything but widths
    if not all(matches):
        raise ValueError(text)
    conv = [{"filters": int(m[1]), "kernel": int(m[2]), "stride": int(m[3] or 1)} for m in matches]
    return StudentConfig(conv=conv, net_arch=net_arch) if conv else net_arch


def variant_name(variant: VariantConfig) -> str:
    """A rung's name from its settings: what it is built from (student-32x32, prune-90, or the
    baseline), cl8 for clusters, then its quantization: qat-int8 (cqat-int8 clustered) with any
    low-bit kernels (hidden_0-4bit), float-heads, eq (its units equalized) and self (QAT to its own
    float weights), or the post-training mode (int8, dynamic, float16; ptq-int8 on the baseline).
    Runs key builds by name, so these stay as the search has always named them."""
    parts = ([student_name(variant.student)] if variant.student else []) + (
        [f"prune-{100 * variant.prune.sparsity:g}"] if variant.prune else [])
    if variant.cluster:
        parts.append(f"cl{variant.cluster.clusters}")
    quantize = variant.quantize
    if quantize and quantize.mode == "qat":
        parts.append("cqat-int8" if variant.cluster else "qat-int8")
        parts += [f"{layer}-{bits}bit" for layer, bits in quantize.kernel_bits.items()]
        parts += ["float-heads"] * quantize.float_head + ["eq"] * quantize.equalize
        parts += ["self"] * (quantize.qat_teacher == "float")
    elif quantize:
        mode = quantize.mode.replace("_", "-")
        parts.append(mode if parts else f"ptq-{mode}")
    return "-".join(parts)


def _named(variant: VariantConfig) -> VariantConfig:
    return VariantConfig.model_validate({**variant.model_dump(), "name": variant_name(variant)})


def _student(entry: list[int] | StudentConfig, from_teacher: str | None = None) -> StudentConfig:
    """A search.students or search.shrunk entry as a student; a shrunk one from the teacher (gap unless it says)."""
    student = entry if isinstance(entry, StudentConfig) else StudentConfig(net_arch=list(entry))
    return student.model_copy(update={"from_teacher": student.from_teacher or from_teacher})


def _families(search: SearchConfig) -> dict[str, list[VariantConfig]]:
    quantized = [search.quantized_baseline.variant()] if search.quantized_baseline else []
    return {"student": [_named(search.student.rung(_student(s))) for s in search.students],
            "shrunk": [_named(search.student.rung(_student(s, "gap"))) for s in search.shrunk],
            "prune": [_named(search.pruned.rung(s)) for s in search.sparsities],
            "quantize": [_named(v) for v in quantized]}


def _fallbacks(search: SearchConfig) -> dict[str, VariantConfig]:
    """Each student rung's second form by the rung's name, where the template has one."""
    out = {}
    for student in map(_student, search.students):
        second = search.student.fallback_rung(student)
        if second is not None:
            out[variant_name(search.student.rung(student))] = _named(second)
    return out


def candidate_variants(search: SearchConfig) -> list[VariantConfig]:
    """Every candidate the search may build, as the variant it is built as."""
    return [v for variants in _families(search).values() for v in variants] + list(_fallbacks(search).values())


def ladders(recipe: Recipe, obs_shape: tuple[int, ...], n_actions: int) -> dict[str, list[Candidate]]:
    """Each family's candidates, largest first (by estimated weight bytes)."""
    families, second = _families(recipe.search), _fallbacks(recipe.search)
    out = {}

    def candidate(family: str, v: VariantConfig) -> Candidate:
        return Candidate(family, v, _estimate(v, recipe.train, tuple(obs_shape), n_actions),
                         _position_bytes(v, recipe.train, tuple(obs_shape), n_actions),
                         candidate(family, second[v.name]) if v.name in second else None)

    for family, variants in families.items():
        rungs = [candidate(family, v) for v in variants]
        if rungs:
            out[family] = sorted(rungs, key=lambda c: -c.estimated_bytes)
    return out
