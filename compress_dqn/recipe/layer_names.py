"""The Q-network's layer names: a recipe names layers (prune and cluster `exclude`, the search's
`pruned.prune.exclude`) that rl/networks.py builds, so both read them from here."""

from __future__ import annotations

OUTPUT = "q_values"
"""The Q-value head (a dueling network's combined head too)."""


def conv(i: int) -> str:
    """The i-th convolution layer."""
    return f"conv_{i}"


def hidden(i: int) -> str:
    """The i-th hidden dense layer."""
    return f"hidden_{i}"


def weight_layers(conv_layers: int, hidden_layers: int) -> list[str]:
    """Every weighted layer of a network with that many conv and hidden layers, input to output."""
    return [conv(i) for i in range(conv_layers)] + [hidden(i) for i in range(hidden_layers)] + [OUTPUT]
