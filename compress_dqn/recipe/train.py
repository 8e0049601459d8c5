"""The recipe's training blocks: DQN hyperparameters (train), the replay's bounds, and a baseline brought from elsewhere.

Keys follow the names RL users know from the RL Zoo / Stable-Baselines3 (`buffer_size`,
`learning_starts`, `target_update_interval`, ...), with the same meaning, so a Zoo hyperparameter
block can be pasted under `train:`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from compress_dqn.recipe.values import (
    ByteSize,
    Count,
    LearningRate,
    PositiveCount,
    Probability,
    StrictModel,
    count_from,
    parse_count,
    real_between,
)


class ConvLayer(StrictModel):
    """One Conv2D layer ('valid' padding) of the Q-network."""

    filters: count_from(1)
    """Output channels."""
    kernel: count_from(1)
    """Square kernel size."""
    stride: count_from(1) = 1
    """Stride in both directions."""


class TrainConfig(StrictModel):
    """DQN hyperparameters, named and defined as in Stable-Baselines3 / the RL Zoo."""

    total_timesteps: PositiveCount = 50_000
    """Environment steps to train for (the Zoo's n_timesteps)."""
    net_arch: list[Annotated[int, BeforeValidator(parse_count)]] = Field(default_factory=lambda: [64, 64])
    """Hidden Dense layer widths (after the conv layers, if any)."""
    conv: list[ConvLayer] = Field(default_factory=list)
    """Conv2D layers before the Dense ones, for image observations (empty: an MLP). The DQN Nature
    network is [{filters: 32, kernel: 8, stride: 4}, {filters: 64, kernel: 4, stride: 2},
    {filters: 64, kernel: 3, stride: 1}] with net_arch [512]; MinAtar's is one 16-filter 3x3 layer
    with net_arch [128]."""
    activation: Literal["relu", "tanh"] = "relu"
    """Hidden layer activation."""
    init: Literal["fan_in_uniform", "glorot_uniform"] = "fan_in_uniform"
    """Weight initialization: kernels and biases from U(+-1/sqrt(fan_in)), PyTorch's default and
    so SB3's (the RL Zoo's hyperparameters were tuned with it), or Keras' Glorot kernels with zero
    biases. docs/training-cartpole.md compares the two (benchmarks/train_cartpole.py)."""
    learning_rate: LearningRate = 1e-4
    """Adam step size. The RL Zoo's `lin_6.3e-4` means 6.3e-4 with learning_rate_schedule: linear."""
    learning_rate_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay the step size linearly to 0 over total_timesteps (SB3's linear schedule)."""
    buffer_size: PositiveCount = 1_000_000
    """Replay capacity in transitions; replay.memory can bound it further by bytes."""
    learning_starts: Count = 100
    """Environment steps collected, acting uniformly at random, before the first gradient step."""
    batch_size: PositiveCount = 32
    """Transitions per gradient step."""
    gamma: Probability = 0.99
    """Discount factor."""
    tau: real_between(0.0, 1.0, lo_open=True) = 1.0
    """Target update coefficient: 1.0 is a hard copy, smaller values are Polyak averaging."""
    target_update_interval: PositiveCount = 10_000
    """Environment steps between target network updates (SB3 counts env steps, not updates)."""
    train_freq: PositiveCount = 4
    """Environment steps between training phases."""
    gradient_steps: PositiveCount = 1
    """Gradient steps per training phase."""
    exploration_fraction: Probability = 0.1
    """Share of total_timesteps over which epsilon decays linearly."""
    exploration_initial_eps: Probability = 1.0
    """Epsilon at the start."""
    exploration_final_eps: Probability = 0.05
    """Epsilon after the decay."""
    max_grad_norm: real_between(0.0, None, lo_open=True) | None = 10.0
    """Clip the global gradient norm to this (null: no clipping)."""
    double_dqn: bool = False
    """Pick next actions with the online network, value them with the target (van Hasselt 2016)."""
    n_steps: count_from(1) = 1
    """Bootstrap after n rewards (n-step returns, SB3's n_steps), sooner at an episode's end."""
    dueling: bool = False
    """Train with a value head and a mean-zero advantage head, Q = V + A - mean A (Wang et al.
    2016; Dopamine's and Tianshou's `dueling`). The combination is linear, so the trained network is
    folded back into one Dense head: the baseline, its exports and every variant keep the plain shape."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss; SB3 uses Huber (smooth L1)."""
    checkpoint_interval: PositiveCount = 10_000
    """Environment steps between checkpoints (taken at the next episode end, for exact resume)."""
    eval_interval: Count = 0
    """Environment steps between evaluations that keep the best weights (0: keep the last)."""
    eval_episodes: PositiveCount = 10
    """Episodes per periodic evaluation."""
    eval_seed: Count = 100_000
    """First seed of the periodic evaluations; kept apart from eval.seed so the final score is unbiased."""
    stop_at_return: float | None = None
    """End training at the first periodic evaluation whose mean return reaches this (SB3's
    StopTrainingOnRewardThreshold; null: train to total_timesteps). On a task whose return is
    capped (CartPole-v1: 500), the cap is a safe bar: later weights can only tie it. Needs eval_interval."""
    jit_compile: bool | None = None
    """Compile the update step with XLA (null: yes, except convolutional networks on a CPU, where
    XLA's convolutions are slower than TensorFlow's own; docs/training-cartpole.md)."""
    intra_op_threads: Annotated[int | None, BeforeValidator(parse_count)] = None
    """TensorFlow intra-op threads (null: TensorFlow's default; a multi-seed run divides the
    CPUs among the seeds training at once). Units that run side by side want one each, so they
    do not fight over cores; one seed alone trains faster on all (docs/training-cartpole.md)."""
    mixed_precision: bool = False
    """Train in mixed float16 on a GPU (Keras' mixed_float16 policy; Q-values stay float32).
    Ignored with a note on CPU, where float16 is slower; the exported policy is float32 either way."""

    @model_validator(mode="before")
    @classmethod
    def _zoo_schedule(cls, data: Any) -> Any:
        """The RL Zoo writes a linear schedule as the string `lin_<initial value>`."""
        rate = data.get("learning_rate") if isinstance(data, dict) else None
        if isinstance(rate, str) and rate.startswith("lin_"):
            return {**data, "learning_rate": rate[4:], "learning_rate_schedule": "linear"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.exploration_final_eps > self.exploration_initial_eps:
            raise ValueError(
                f"exploration_final_eps {self.exploration_final_eps} is above exploration_initial_eps "
                f"{self.exploration_initial_eps}; epsilon only decays"
            )
        if any(width < 1 for width in self.net_arch):
            raise ValueError(f"net_arch {self.net_arch} has a layer width below 1")
        if self.stop_at_return is not None and not self.eval_interval:
            raise ValueError(
                f"stop_at_return {self.stop_at_return} needs periodic evaluations: set eval_interval "
                "(e.g. 2500) or remove stop_at_return"
            )
        return self


class ReplayConfig(StrictModel):
    """Replay buffer bounds beyond train.buffer_size."""

    memory: ByteSize | None = None
    """Byte budget for the buffer (e.g. 512MiB); the capacity is the smaller of this and buffer_size.
    With compress, the buffer keeps buffer_size rows and evicts its oldest ones past this budget."""
    compress: Literal["zstd"] | None = None
    """Keep frames compressed in memory (zstd, each a delta against a nearby key frame): an Atari
    transition takes a few hundred bytes instead of 7 KB, samples stay bit-identical, sampling
    costs a little more (docs/replay-memory.md). null: frames stored as they are."""


class RolloutConfig(StrictModel):
    """Data for a loaded baseline: play it epsilon-greedily and keep the transitions."""

    steps: PositiveCount = 20_000
    """Environment steps to collect (calibration, distillation and TD fine-tuning sample these)."""
    epsilon: Probability = 0.3
    """Share of random actions. Calibration needs states beyond the greedy path, which a nearly
    greedy rollout seldom leaves (docs/quantization.md compares two values on CartPole)."""


class BaselineConfig(StrictModel):
    """Start from a Q-network trained elsewhere instead of training one."""

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    from_: str = Field(alias="from", min_length=1)
    """A tf_keras model (.keras, .h5, Keras SavedModel directory), a Stable-Baselines3 DQN .zip, a PyTorch
    state dict (.pt, .pth, .cleanrl_model) or an .onnx file: observations -> Q-values."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """How to collect data by playing the loaded policy (ignored when transitions is given)."""
    transitions: str | None = None
    """An .npz of transitions instead of a rollout: observations, actions, rewards,
    next_observations, terminated, truncated (one row per transition)."""
