"""Structured pruning from the teacher (compress/structured.py): the student starts as the teacher's
kept filters and units with their weights, so units that carry nothing can leave without changing a
Q-value, on MLPs and on CNNs (whose Flatten interleaves the kept channels)."""

from __future__ import annotations

import numpy as np
import pytest

from compress_dqn.compress.structured import RANKS, check_shrinkable, shrink_from_teacher
from compress_dqn.rl.networks import build_q_network


class _Conv:
    def __init__(self, filters: int, kernel: int = 3, stride: int = 1) -> None:
        self.filters, self.kernel, self.stride = filters, kernel, stride


def _dead_units(model, layer_index: int, dead: list[int]) -> None:
    """Zero the incoming weights and bias of `dead` units of a weight layer and what reads them next."""
    layers = [l for l in model.layers if l.weights]
    kernel, bias = layers[layer_index].get_weights()
    kernel[..., dead] = 0.0
    bias[dead] = 0.0
    layers[layer_index].set_weights([kernel, bias])
    nxt, nbias = layers[layer_index + 1].get_weights()
    channels = kernel.shape[-1]
    view = nxt.reshape(-1, channels, nxt.shape[-1])
    view[:, dead, :] = 0.0
    layers[layer_index + 1].set_weights([view.reshape(nxt.shape), nbias])


@pytest.mark.parametrize("rank", RANKS)
def test_mlp_without_its_dead_units_keeps_every_q_value(rank):
    rng = np.random.default_rng(0)
    teacher = build_q_network((6,), 3, [16, 12], name="teacher")
    _dead_units(teacher, 0, [1, 4, 5, 9, 12, 15])
    _dead_units(teacher, 1, [0, 2, 7, 11])
    student = build_q_network((6,), 3, [10, 8], name="student")
    states = rng.normal(size=(256, 6)).astype(np.float32)
    kept = shrink_from_teacher(teacher, student, states, rank)
    if rank == "magnitude":  # the others may swap a dead unit for one that ReLU keeps at 0 on every state
        assert [k.tolist() for k in kept] == [[0, 2, 3, 6, 7, 8, 10, 11, 13, 14], [1, 3, 4, 5, 6, 8, 9, 10]]
    np.testing.assert_allclose(student(states).numpy(), teacher(states).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", RANKS)
def test_cnn_without_its_dead_filters_keeps_every_q_value(rank):
    rng = np.random.default_rng(1)
    teacher = build_q_network((6, 6, 3), 4, [12], conv=[_Conv(6)], input_scale=1.0, name="teacher")
    _dead_units(teacher, 0, [0, 3, 4])
    _dead_units(teacher, 1, [5, 6, 7, 8])
    student = build_q_network((6, 6, 3), 4, [8], conv=[_Conv(3)], input_scale=1.0, name="student")
    states = rng.integers(0, 2, size=(128, 6, 6, 3)).astype(np.uint8)
    kept = shrink_from_teacher(teacher, student, states, rank)
    assert list(kept[0]) == [1, 2, 5]
    np.testing.assert_allclose(student(states).numpy(), teacher(states).numpy(), rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("rank", ["gap", "activation"])
@pytest.mark.parametrize("conv", [False, True])
def test_a_removed_unit_that_sends_a_constant_leaves_it_in_the_next_layers_bias(conv, rank):
    """A unit whose output is the same on every state (zero incoming weights, a positive bias) carries
    no gap but moves every Q-value: removed, its mean output joins the next layer's bias exactly."""
    rng = np.random.default_rng(3)
    shape, student_conv = ((5, 5, 2), [_Conv(3)]) if conv else ((6,), [])
    teacher = build_q_network(shape, 3, [8], conv=[_Conv(4)] if conv else [], name="teacher")
    student = build_q_network(shape, 3, [8] if conv else [7], conv=student_conv, name="student")
    kernel, bias = teacher.layers[0 if not conv else 0].get_weights()
    kernel[..., 0] = 0.0
    bias[0] = 0.7  # unit 0: relu(0.7) everywhere; the others' biases are 0 at initialization
    teacher.layers[0].set_weights([kernel, bias])
    states = rng.normal(size=(64, *shape)).astype(np.float32)
    shrink_from_teacher(teacher, student, states, rank)  # exact only if unit 0 (or one as still) went
    np.testing.assert_allclose(student(states).numpy(), teacher(states).numpy(), rtol=1e-5, atol=1e-5)


def test_ranks_keep_the_units_that_carry_the_gap():
    """A unit that reads a large input but whose output nothing reads is kept by magnitude alone."""
    rng = np.random.default_rng(2)
    teacher = build_q_network((4,), 2, [4], name="teacher")
    kernel, bias = teacher.layers[0].get_weights()
    kernel[:, 0] = 10.0  # large incoming weights ...
    teacher.layers[0].set_weights([kernel, bias])
    out, obias = teacher.layers[1].get_weights()
    out[0, :] = 0.0  # ... and nothing reads it
    teacher.layers[1].set_weights([out, obias])
    states = rng.normal(size=(64, 4)).astype(np.float32)
    kept = {rank: shrink_from_teacher(teacher, build_q_network((4,), 2, [3], name=f"s_{rank}"), states, rank)[0]
            for rank in RANKS}
    assert 0 in kept["magnitude"] and 0 not in kept["activation"] and 0 not in kept["gap"]


def test_a_student_that_is_not_a_narrower_teacher_is_refused():
    teacher = build_q_network((6,), 3, [16, 12], name="teacher")
    with pytest.raises(ValueError, match="weight layers"):
        check_shrinkable(teacher, build_q_network((6,), 3, [8], name="a"))
    with pytest.raises(ValueError, match="wider"):
        check_shrinkable(teacher, build_q_network((6,), 3, [32, 8], name="b"))
    cnn = build_q_network((6, 6, 3), 4, [12], conv=[_Conv(6)], name="c")
    with pytest.raises(ValueError, match="kernel size and stride"):
        check_shrinkable(cnn, build_q_network((6, 6, 3), 4, [12], conv=[_Conv(3, kernel=2)], name="d"))


def test_a_variant_started_from_the_teacher_is_the_teacher_where_it_keeps_every_unit(trained_tiny):
    """build_variant with student.from_teacher: the same widths keep every unit, so before any real
    distillation the student's Q-values are the baseline's; a student of other layers is refused in one line."""
    from compress_dqn.compress.build import build_variant
    from compress_dqn.errors import UserError
    from compress_dqn.rl.networks import q_from_outputs

    from conftest import variant

    recipe, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(500)).observations
    tiny_step = {"steps": 1, "learning_rate": 1e-12}
    built = build_variant(variant(recipe, student={"net_arch": [32, 32], "from_teacher": "gap"}, fine_tune=tiny_step),
                          result.model, result.replay, recipe, result.info, quiet=True)
    np.testing.assert_allclose(q_from_outputs(built.export_model(obs)).numpy(), result.model(obs).numpy(), atol=1e-4)
    with pytest.raises(UserError, match="from_teacher: a student started from the teacher needs the teacher's 3"):
        build_variant(variant(recipe, student={"net_arch": [8], "from_teacher": "gap"}, fine_tune=tiny_step),
                      result.model, result.replay, recipe, result.info, quiet=True)
