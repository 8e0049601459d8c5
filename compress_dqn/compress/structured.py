"""Structured pruning from the teacher: a smaller dense network that starts as the teacher's most
useful conv filters and dense units, with their weights.

Magnitude pruning (prune.py) zeroes single weights and keeps every layer's shape, so a runtime
without sparse kernels (TFLite Micro, the C export) still stores and multiplies the zeros. Removing
whole filters and units gives a network that is small in every runtime; starting it from the
teacher's weights, rather than from scratch as a student does, starts the distillation near the
teacher's function (on MinAtar Space Invaders, pruning from the teacher kept the return where
students trained from scratch lost it: docs/minatar.md).

A unit's rank (higher is kept). Removing a unit moves its mean output into the next layer's bias,
so what a removal loses is the unit's variation about its mean, which the ranks measure:
- magnitude: the L1 norm of its incoming weights (Li et al. 2017, filters).
- activation: the standard deviation of its output on the states times the L2 norm of its
  outgoing weights: how much variation it sends on.
- gap: |(activation - its mean) x d(gap)/d(activation)|, summed over a filter's positions and
  averaged over the states, where gap is the teacher's best Q-value less its second best: a
  first-order estimate of how much of the action gap the unit carries (the Taylor criterion of
  Molchanov et al. 2017 with the action gap as the objective).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compress_dqn._tf import tf, tf_keras

RANKS = ("magnitude", "activation", "gap")


def _weighted(model: tf_keras.Model) -> list[tf_keras.layers.Layer]:
    return [layer for layer in model.layers if isinstance(layer, (tf_keras.layers.Conv2D, tf_keras.layers.Dense))]


def check_shrinkable(teacher: tf_keras.Model, student: tf_keras.Model) -> None:
    """ValueError unless the student is the teacher with fewer filters or units per hidden layer."""
    ours, theirs = _weighted(student), _weighted(teacher)
    if len(ours) != len(theirs):
        raise ValueError(f"a student started from the teacher needs the teacher's {len(theirs)} weight layers, "
                         f"not {len(ours)}")
    for mine, its in zip(ours, theirs):
        if type(mine) is not type(its):
            raise ValueError(f"{mine.name} is a {type(mine).__name__} where the teacher has a {type(its).__name__}")
        if isinstance(mine, tf_keras.layers.Conv2D) and (mine.kernel_size != its.kernel_size or mine.strides != its.strides):
            raise ValueError(f"{mine.name}: a student started from the teacher keeps its kernel size and stride "
                             f"({its.kernel_size[0]}, stride {its.strides[0]})")
        if mine.kernel.shape[-1] > its.kernel.shape[-1]:
            raise ValueError(f"{mine.name} is wider ({mine.kernel.shape[-1]}) than the teacher's ({its.kernel.shape[-1]})")
    if ours[-1].kernel.shape[-1] != theirs[-1].kernel.shape[-1]:
        raise ValueError("the student's output layer must have the teacher's actions")


def _activations(teacher: tf_keras.Model, states: np.ndarray) -> tuple[list[tf.Tensor], tf.Tensor, tf.GradientTape]:
    """Each weight layer's output (after its activation) and the Q-values, on a tape watching them."""
    layers, acts = _weighted(teacher), []
    with tf.GradientTape() as tape:
        x = tf.convert_to_tensor(states)
        for layer in teacher.layers:
            x = layer(x)
            if layer in layers[:-1]:
                tape.watch(x)
                acts.append(x)
        top2 = tf.math.top_k(x, k=2).values
        gap = tf.reduce_sum(top2[:, 0] - top2[:, 1])
    return acts, gap, tape


def unit_scores(layers: list[tf_keras.layers.Layer], acts: list[tf.Tensor], gap: tf.Tensor, tape: tf.GradientTape,
                rank: str) -> list[np.ndarray]:
    """One score per filter or unit of each hidden weight layer (the output layer keeps every action), from
    the teacher's weight layers and its activations on the states (_activations)."""
    if rank not in RANKS:
        raise ValueError(f"unknown rank {rank!r}; choose from {', '.join(RANKS)}")
    if rank == "magnitude":
        return [np.abs(layer.kernel.numpy()).reshape(-1, layer.kernel.shape[-1]).sum(axis=0) for layer in layers[:-1]]
    centred = [a - tf.reduce_mean(a, axis=0, keepdims=True) for a in acts]
    if rank == "gap":
        grads = tape.gradient(gap, acts)
        return [np.abs(tf.reduce_sum(tf.reshape(c * g, (c.shape[0], -1, c.shape[-1])), axis=1).numpy()).mean(axis=0)
                for c, g in zip(centred, grads)]
    scores = []
    for i, c in enumerate(centred):
        spread = np.sqrt((c.numpy() ** 2).reshape(-1, c.shape[-1]).mean(axis=0))
        # What reads unit u in the next layer, whether a conv kernel (kh, kw, u, out), a Dense
        # layer after Flatten (position, u, out) or after Dense (u, out): axis 1 of this reshape.
        outgoing = layers[i + 1].kernel.numpy().reshape(-1, c.shape[-1], layers[i + 1].kernel.shape[-1])
        scores.append(spread * np.sqrt((outgoing ** 2).sum(axis=(0, 2))))
    return scores


def kept_units(scores: Sequence[np.ndarray], widths: Sequence[int]) -> list[np.ndarray]:
    """The `width` best-scored units of each layer, in their original order (ties: the earlier unit)."""
    return [np.sort(np.argsort(-s, kind="stable")[:w]) for s, w in zip(scores, widths)]


def shrink_from_teacher(teacher: tf_keras.Model, student: tf_keras.Model, states: np.ndarray, rank: str) -> list[np.ndarray]:
    """Set the student's weights to the teacher's at its best-ranked filters and units, each removed
    unit's mean output on the states moved into the next layer's bias; returns the kept indices of
    each hidden layer."""
    check_shrinkable(teacher, student)
    ours, theirs = _weighted(student), _weighted(teacher)
    acts, gap, tape = _activations(teacher, states)  # one forward pass: the ranks and the removed units' means
    kept = kept_units(unit_scores(theirs, acts, gap, tape, rank), [layer.kernel.shape[-1] for layer in ours[:-1]])
    means = [a.numpy().mean(axis=0) for a in acts]
    rows = None  # the teacher's inputs that the student's current layer reads
    for i, (mine, its) in enumerate(zip(ours, theirs)):
        kernel, bias = (w.numpy() for w in its.weights[:2])
        if rows is not None:
            bias = bias + _removed_share(kernel, means[i - 1], rows)
        if isinstance(its, tf_keras.layers.Conv2D):
            kernel = kernel if rows is None else kernel[:, :, rows, :]
        elif rows is not None:
            kernel = kernel[_flat_rows(its, theirs[i - 1], rows)]
        cols = kept[i] if i < len(kept) else np.arange(kernel.shape[-1])
        mine.set_weights([kernel[..., cols], bias[cols]])
        rows = cols
    return kept


def _removed_share(kernel: np.ndarray, mean: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """What the units of the layer before that are not kept sent into each unit of this one, on
    average over the states: without it the narrowed layer's inputs lose their mean and every
    Q-value shifts (on LunarLander's 256x256 DQN, 64 of 256 units agreed with the teacher's action
    on 8-49% of states before distillation). `mean`: their mean output, per position for a conv
    layer; a conv kernel reading it sees its spatial mean."""
    channels = mean.shape[-1]
    gone = np.setdiff1d(np.arange(channels), kept)
    reads = kernel.reshape(-1, channels, kernel.shape[-1])  # (positions or kernel taps, channel, out)
    sent = mean.reshape(-1, channels)
    if kernel.ndim == 4:  # a conv kernel's taps each read the spatial mean
        sent = np.broadcast_to(sent.mean(axis=0, keepdims=True), reads.shape[:2])
    return np.einsum("pco,pc->o", reads[:, gone, :], sent[:, gone])


def _flat_rows(dense: tf_keras.layers.Layer, before: tf_keras.layers.Layer, channels: np.ndarray) -> np.ndarray:
    """A Dense layer's input rows for the kept units of the layer before it: after a conv layer,
    Flatten lays out (height, width, channel) with the channel fastest, so each position keeps the
    kept channels' rows."""
    if not isinstance(before, tf_keras.layers.Conv2D):
        return channels
    n_channels = before.kernel.shape[-1]
    positions = dense.kernel.shape[0] // n_channels
    return (np.arange(positions)[:, None] * n_channels + channels[None, :]).reshape(-1)
