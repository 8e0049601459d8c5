"""The YAML recipe as pydantic models: pure data, validated before anything runs.

Keys follow the names RL users know from the RL Zoo / Stable-Baselines3 (`buffer_size`,
`learning_starts`, `target_update_interval`, ...), with the same meaning, so a Zoo
hyperparameter block can be pasted under `train:`. Errors name the dotted key, the bad value and
what is allowed, in one line. This module must not import TensorFlow or numpy: `validate` and
`--help` stay fast.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from compress_dqn.recipe import layer_names
from compress_dqn.errors import UserError
from compress_dqn.recipe.safe_yaml import read_yaml, read_yaml_text

# ---------------------------------------------------------------------------------------------
# Value types: counts written as 1e6 and numbers as 1e-3 (YAML reads those as strings); bounds
# are pydantic constraints, worded by _format_error.
# ---------------------------------------------------------------------------------------------

def _parse_count(value: Any) -> Any:
    """Accept 50000, 5e4, "5e4" and "50_000" for integer counts; reject fractions and booleans."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number")
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            value = float(text) if any(c in text.lower() for c in ".e") else int(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a whole number (write e.g. 50000 or 5e4)") from None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{value!r} is not a whole number")
        value = int(value)
    return value


def _parse_float(value: Any) -> Any:
    """Accept 2.3e-3 written either way (YAML reads `1e-3` without a dot as a string)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return value


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    return value


MAX_COUNT = 2**63 - 1
"""Counts index NumPy arrays and TensorFlow step counters (int64): a larger one cannot run, and
formatting its byte size would overflow a float."""


def _count(lo: int = 0) -> Any:
    return Annotated[int, BeforeValidator(_parse_count), Field(ge=lo, le=MAX_COUNT)]


def _real(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> Any:
    bounds = {("gt" if lo_open else "ge"): lo, ("lt" if hi_open else "le"): hi}
    return Annotated[float, BeforeValidator(_parse_float), Field(**{k: v for k, v in bounds.items() if v is not None})]


Count = _count(0)
PositiveCount = _count(1)
QatTeacher = Literal["baseline", "float"]
"""Whom a QAT fine-tune distils to (QuantizeConfig.qat_teacher)."""
Seed = Annotated[int, BeforeValidator(_parse_count), Field(ge=0, le=2**32 - 1)]
"""A training seed: NumPy's legacy global seed (which TensorFlow's seeding sets) takes 0..2**32-1."""
Probability = _real(0.0, 1.0)
ByteSize = Annotated[pydantic.ByteSize, BeforeValidator(_not_bool)]
"""536870912, "512MiB", "1.5 GB" (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024): pydantic's ByteSize."""


class StrictModel(BaseModel):
    """Rejects unknown keys with a did-you-mean and the list of valid keys."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = [field.alias or name for name, field in cls.model_fields.items()]
            for key in data:
                if key not in valid:
                    close = difflib.get_close_matches(str(key), valid, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key{hint}; valid keys: {valid}",
                        {"key": str(key), "hint": hint, "valid": ", ".join(valid)},
                    )
        return data


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


_ATARI_ID = re.compile(r"ALE/.+|[A-Za-z]\w*NoFrameskip-v4")


def is_atari_id(env_id: str) -> bool:
    """ALE/ ids and the RL Zoo's *NoFrameskip-v4 ids (both from ale-py): the ones env.atari applies to."""
    return bool(_ATARI_ID.fullmatch(env_id))


def atari_preprocessing(env_id: str, chosen: str | None) -> str:
    """env.atari.preprocessing, or its default: SB3's for the RL Zoo's *NoFrameskip-v4 ids, gymnasium's for ALE/."""
    return chosen or ("gymnasium" if env_id.startswith("ALE/") else "sb3")


class AtariConfig(StrictModel):
    """The Atari preprocessing: gymnasium's AtariPreprocessing (Machado et al. 2018 settings by
    default) or Stable-Baselines3's AtariWrapper, the one RL Zoo agents were trained behind."""

    preprocessing: Literal["gymnasium", "sb3"] | None = None
    """gymnasium: gymnasium's AtariPreprocessing; sb3: SB3's AtariWrapper with VecFrameStack's
    frame stack (from zeros at every episode boundary), training episodes ending at a lost life with
    rewards clipped to their sign, evaluation over whole games with the game's own rewards. None: sb3
    for *NoFrameskip-v4 ids, gymnasium for ALE/ ids. A ported SB3 Atari CnnPolicy picks sb3."""
    noop_max: Count = 30
    """Up to this many no-op actions at reset, so starts differ."""
    frame_skip: _count(1) = 4
    """Repeat each action this many frames (max-pooling the last two)."""
    screen_size: _count(8) = 84
    """Frames are resized to screen_size x screen_size."""
    terminal_on_life_loss: bool | None = None
    """End the (training) episode when a life is lost (the DQN Nature paper's trick). None: as the
    preprocessing does by default, off for gymnasium's (as recommended since), on for SB3's."""
    grayscale_obs: bool = True
    """One luminance channel instead of RGB (SB3's preprocessing is always grayscale)."""
    scale_obs: Literal[False] = False
    """Always False: frames stay uint8 (4x less replay memory); the network scales them."""


class EnvConfig(StrictModel):
    """Which gymnasium environment to train and evaluate on."""

    id: str = Field(min_length=1)
    """A registered gymnasium id, e.g. CartPole-v1, LunarLander-v3, ALE/Breakout-v5 or the RL Zoo's
    BreakoutNoFrameskip-v4. Discrete actions only."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to gymnasium.make."""
    max_episode_steps: PositiveCount | None = None
    """Override the environment's time limit (episodes end truncated, and bootstrap)."""
    atari: AtariConfig | None = None
    """Atari preprocessing for ALE/ and *NoFrameskip-v4 ids (always applied to them; None: the defaults)."""
    frame_stack: _count(1) = 1
    """Stack the last k frames on the last axis (4 for Atari); the replay stores each frame once."""

    @model_validator(mode="after")
    def _atari_only_for_ale(self) -> "EnvConfig":
        if self.atari is not None and not is_atari_id(self.id):
            raise ValueError(f"atari preprocessing applies to Atari ids only (ALE/... or ...NoFrameskip-v4), "
                             f"not {self.id!r}; remove env.atari")
        if self.atari is not None and self.atari.preprocessing == "sb3" and not self.atari.grayscale_obs:
            raise ValueError("atari.grayscale_obs: SB3's AtariWrapper is always grayscale; remove grayscale_obs: false")
        return self


class ConvLayer(StrictModel):
    """One Conv2D layer ('valid' padding) of the Q-network."""

    filters: _count(1)
    """Output channels."""
    kernel: _count(1)
    """Square kernel size."""
    stride: _count(1) = 1
    """Stride in both directions."""


class TrainConfig(StrictModel):
    """DQN hyperparameters, named and defined as in Stable-Baselines3 / the RL Zoo."""

    total_timesteps: PositiveCount = 50_000
    """Environment steps to train for (the Zoo's n_timesteps)."""
    net_arch: list[Annotated[int, BeforeValidator(_parse_count)]] = Field(default_factory=lambda: [64, 64])
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
    learning_rate: _real(0.0, 1.0, lo_open=True) = 1e-4
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
    tau: _real(0.0, 1.0, lo_open=True) = 1.0
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
    max_grad_norm: _real(0.0, None, lo_open=True) | None = 10.0
    """Clip the global gradient norm to this (null: no clipping)."""
    double_dqn: bool = False
    """Pick next actions with the online network, value them with the target (van Hasselt 2016)."""
    n_steps: _count(1) = 1
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
    intra_op_threads: Annotated[int | None, BeforeValidator(_parse_count)] = None
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


class EvalConfig(StrictModel):
    """Final evaluation: greedy episodes on fixed seeds, shared by every variant."""

    episodes: PositiveCount = 100
    """Episodes every variant plays first, on seeds seed .. seed+episodes-1."""
    seed: Count = 0
    """First episode seed."""
    max_episodes: PositiveCount | None = None
    """Sequential evaluation: while a variant's verdict is inconclusive, double its episodes (and
    the baseline's and the random policy's) up to this many; each look's CI is widened to
    1 - 0.05/looks so the repeated looks keep a 5% error rate overall. null: episodes only."""
    tolerance: _real(0.0, 1.0, lo_open=True) = 0.01
    """Non-inferiority margin, as a share of the baseline's lead over a uniform-random policy on
    the same episodes: 0.01 means "keeps 99% of what the baseline adds over random"."""
    heldout_seed: Count = 1_000_000
    """First seed of the episodes whose states measure action agreement; no calibration, fine-tune
    or return evaluation plays them."""
    heldout_episodes: PositiveCount = 10
    """Baseline episodes (greedy) whose visited states measure action agreement."""

    @model_validator(mode="after")
    def _cap(self) -> EvalConfig:
        if self.max_episodes is not None and self.max_episodes < self.episodes:
            raise ValueError(f"max_episodes {self.max_episodes} is below episodes {self.episodes}; raise it or drop it")
        seeds = range(self.seed, self.seed + (self.max_episodes or self.episodes))
        if self.heldout_seed in seeds or self.seed in range(self.heldout_seed, self.heldout_seed + self.heldout_episodes):
            raise ValueError(f"heldout_seed {self.heldout_seed} overlaps the evaluation seeds {seeds.start}..{seeds.stop - 1}; "
                             "move one of them")
        return self


class PruneSettings(StrictModel):
    """Magnitude pruning less its target: how, when and where (a search's pruned family; its
    sparsities give each rung's target)."""

    schedule: Literal["polynomial", "constant"] = "polynomial"
    """PolynomialDecay (ramp from 0 to sparsity) or ConstantSparsity (at sparsity from begin)."""
    begin_fraction: Probability = 0.0
    """When pruning starts, as a share of the fine-tune's gradient steps."""
    end_fraction: Probability = 0.6
    """When the polynomial ramp reaches the target (the rest of the fine-tune recovers)."""
    frequency: PositiveCount = 50
    """Gradient steps between mask updates."""
    exclude: list[str] = Field(default_factory=list)
    """Layer names kept dense, e.g. [q_values] for the output layer."""
    sparse_format: bool = True
    """Store pruned kernels in TFLite's sparse format where that makes the file smaller and acts the
    same. The full runtime expands them at load (a DENSIFY op); TFLite Micro has no such kernel,
    so set false for a microcontroller policy."""

    @model_validator(mode="after")
    def _ordered(self) -> PruneSettings:
        if self.schedule == "polynomial" and self.end_fraction <= self.begin_fraction:
            raise ValueError(f"end_fraction {self.end_fraction} must be after begin_fraction {self.begin_fraction}")
        return self


class _Sparsity(StrictModel):
    sparsity: _real(0.0, 1.0, hi_open=True)
    """Target share of zero weights in each pruned layer's kernel."""


class PruneConfig(PruneSettings, _Sparsity):  # _Sparsity last: sparsity stays the first key written
    """Magnitude pruning (tfmot prune_low_magnitude), reached during the recovery fine-tune."""


QUANTIZE_MODES = ("dynamic", "float16", "int8", "int16x8", "qat")


KernelBits = dict[str, Annotated[int, Field(ge=2, le=7)]]
"""Layer name -> its kernel's bits in QAT (compress.low_bit stores 2-7 bits exactly)."""


class QuantizeConfig(StrictModel):
    """Post-training quantization at TFLite conversion, or quantization-aware training (qat)."""

    mode: Literal["dynamic", "float16", "int8", "int16x8", "qat"]
    """dynamic: int8 weights; float16: fp16 weights; int8: full integer (calibrated on replay
    observations); int16x8: int16 activations, int8 weights; qat: tfmot quantize_model + fine-tune."""
    calibration_samples: PositiveCount = 1000
    """Replay observations in the representative dataset (int8, int16x8)."""
    int8_io: bool = False
    """Make the TFLite input and Q-value output int8 too (full-integer accelerators need it)."""
    normalize_input: bool = True
    """int8/int16x8/qat on flat float observations: give each feature its own range. The policy takes
    (obs - mean) / std (replay statistics, folded into the first layer; the loader applies it from
    the .tflite's metadata), so one input scale fits every feature."""
    input_scaling: Literal["std", "range"] = "std"
    """How normalize_input scales each feature for post-training int8/int16x8: std, (obs - mean) /
    std; range, (obs - midrange) / half-range, so every feature spans the whole int8 input range
    (compress.rewrites.input_range). QAT always uses std."""
    action_head: bool = False
    """int8: choose the action on a third int8 head (a tensor that feeds ARG_MAX) holding only the
    top of the advantage's range (compress.rewrites.with_action_head), not on the advantage head itself."""
    preserve: bool = True
    """For qat on a pruned or clustered model: keep its sparsity/clusters (PQAT/CQAT)."""
    per_channel_dense: bool = True
    """qat on a CNN: give the first Dense layer after the conv stack one kernel scale per unit, as
    post-training int8 gives Dense kernels (tfmot's QAT gives it one scale for the whole kernel).
    The layer is computed as an equivalent CONV_2D over the whole feature map
    (compress.rewrites.flattened_dense_as_conv): the same weights and outputs, and the converter
    keeps per-channel scales for convolutions. No effect on networks without conv layers or on
    post-training modes (the converter already gives their Dense kernels a scale per unit)."""
    float_head: bool = False
    """qat: leave the output heads (advantage and value) in float: the int8 body's last features
    feed float heads, so the action is chosen on float advantages. Why: a small student's action
    gaps can be below one int8 step of its advantage output (whose range spans the rare states
    where one action is far better), and int8 then ties or flips them; the heads are a few
    hundred weights (4 bytes each). TFLite Micro and the C export run the float heads as well."""
    equalize: bool = False
    """qat with float_head: before QAT, scale each unit feeding the float heads so that all span the
    same range on the calibration states, the heads' weights divided to match (exact in float;
    compress.rewrites.equalize_head_input). Why: the int8 tensor those units share has one range,
    and most units used a few of its steps (MinAtar Space Invaders, docs/minatar.md)."""
    kernel_bits: KernelBits = Field(default_factory=dict)
    """qat: layers whose kernel trains and exports at 2-7 bits instead of 8, e.g. {hidden_0: 4}. The
    kernel keeps one scale per output unit (per_channel_dense on a CNN) and takes the 2^b-1 integers
    -(2^(b-1)-1)..2^(b-1)-1, the same in every unit, stored exactly as INT4 (b <= 4) or INT8
    (compress.low_bit): runtimes play it as any such kernel, and gzip stores each weight in about b
    bits or fewer. Why not clustering for that: a cluster's centroid becomes a different byte under
    each unit's scale, so a clustered kernel with a scale per unit holds many more distinct bytes
    (docs/minatar.md)."""
    qat_teacher: QatTeacher = "baseline"
    """qat: whom the QAT fine-tune distils to: the baseline, or the variant's own float model as QAT
    starts from it (a student's distilled weights). Why float: its fake-quantized copy can match
    its float self exactly, so QAT's steps go to undoing the rounding rather than to chasing what a
    small student cannot reach. On the same MinAtar Breakout float builds it was no better: worse
    on 5 of 7 (docs/minatar.md). Needs fine_tune.method: distill."""
    qat_steps: _count(1) | None = None
    """Gradient steps of the QAT fine-tune (default: fine_tune.steps)."""
    qat_learning_rate: _real(0.0, 1.0, lo_open=True) | None = None
    """Adam step size of the QAT fine-tune (default: fine_tune.learning_rate). QAT starts from a
    tuned model: a distillation's step size can undo it."""

    @model_validator(mode="after")
    def _post_training_options(self) -> QuantizeConfig:
        if self.float_head and self.mode != "qat":
            raise ValueError(f"float_head applies to mode qat only, not {self.mode}; remove it or use mode: qat")
        if self.equalize and not self.float_head:
            raise ValueError("equalize needs float_head: true (int8 heads would take the inverse scales into their "
                             "weights' ranges); add float_head: true or remove equalize")
        if self.kernel_bits and self.mode != "qat":
            raise ValueError(f"kernel_bits applies to mode qat only, not {self.mode}; remove it or use mode: qat")
        if self.qat_teacher != "baseline" and self.mode != "qat":
            raise ValueError(f"qat_teacher applies to mode qat only, not {self.mode}; remove it or use mode: qat")
        if self.action_head and self.mode != "int8":
            raise ValueError(f"action_head applies to mode int8 only, not {self.mode}; remove it or use mode: int8")
        if self.input_scaling != "std" and self.mode not in ("int8", "int16x8"):
            raise ValueError(f"input_scaling applies to modes int8 and int16x8 only, not {self.mode}; remove it")
        if self.input_scaling != "std" and not self.normalize_input:
            raise ValueError("input_scaling scales the normalized input; with normalize_input: false there is none: remove one")
        return self


class ClusterConfig(StrictModel):
    """Weight clustering (tfmot cluster_weights): each kernel keeps only `clusters` distinct values."""

    clusters: _count(2)
    """Number of centroids per layer."""
    init: Literal["kmeans_plus_plus", "linear", "density_based", "random"] = "kmeans_plus_plus"
    """Centroid initialisation."""
    exclude: list[str] = Field(default_factory=list)
    """Layer names left unclustered."""
    steps: PositiveCount | None = None
    """A student's clustered fine-tune, after its distillation in float (gradient steps); default:
    the variant's fine_tune.steps. Clustering a student's random start would train all of its
    distillation through the wrapper, at ~2x the cost a step."""
    learning_rate: _real(0.0, 1.0, lo_open=True) | None = None
    """The clustered fine-tune's Adam step size after a student's distillation; default: fine_tune's."""


class StudentConfig(StrictModel):
    """A smaller network trained by Q-value distillation from the baseline."""

    net_arch: list[PositiveCount]
    """Hidden Dense layer widths of the student, e.g. [32, 32]."""
    activation: Literal["relu", "tanh"] = "relu"
    conv: list[ConvLayer] = Field(default_factory=list)
    """Conv2D layers before the Dense ones (empty: an MLP student on the flattened observation)."""
    from_teacher: Literal["gap", "activation", "magnitude"] | None = None
    """Start as the baseline's best-ranked conv filters and dense units with their weights (structured
    pruning), not fresh weights: ranked by the action gap each carries (gap: |activation x d gap /
    d activation|), by its activation times its outgoing weights (activation), or by its incoming
    weights (magnitude). Needs the baseline's layers, none wider, with its conv kernels and strides."""


class FineTuneConfig(StrictModel):
    """Recovery fine-tune after wrapping a model for pruning, clustering or QAT."""

    method: Literal["distill", "td"] = "distill"
    """distill: regress Q-values to the frozen baseline's on replay observations (no env steps);
    td: continue DQN training in the environment with the baseline's replay and target."""
    steps: PositiveCount = 5000
    """Gradient steps (distill) or environment steps (td)."""
    learning_rate: _real(0.0, 1.0, lo_open=True) = 1e-4
    """Adam step size of the fine-tune."""
    learning_rate_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay the step size linearly to 0 over the fine-tune's steps, so that its last
    weights are settled rather than one noisy step among many."""
    batch_size: PositiveCount = 256
    """Observations per distillation step (td uses train.batch_size)."""
    loss: Literal["policy", "mse"] = "policy"
    """distill loss: policy = KL of softmax(Q/temperature) (keeps the action ranking; Rusu et al.
    2016) + Q error / Q variance (keeps the scale); mse = squared Q error (can flip near-tied actions)."""
    temperature: _real(0.0, None, lo_open=True) = 0.01
    """Softmax temperature of the policy loss, in Q units: gaps above it are ranked sharply."""
    advantage_weight: _real(0.0, None) = 0.0
    """policy loss: add the advantages' (Q - mean over actions) squared error over their variance,
    times this. The Q term is scaled by the Q-values' variance across states, which dwarfs the
    action gaps, so a student can match Q well with gaps a fraction of the teacher's; an int8 step
    then flips its actions. 0: off. On a MinAtar student it widened the int8 gaps but cost more
    agreement than it kept (the largest advantages dominate the error; docs/minatar.md)."""
    margin_weight: _real(0.0, None) = 0.0
    """policy loss: add, times this, how far the student's lead of the teacher's best action over its
    own next best falls short of the teacher's lead (its best less second-best Q-value), over the
    advantages' spread: a hinge on the ranking that weighs each state by its gap, where the KL at
    temperature 0.01 is flat once an action is ranked first. 0: off."""
    select_interval: Count = 0
    """Every this many gradient steps (and at the end), play the model on select_episodes episodes
    from train.eval_seed and keep the best weights, as the baseline's training does; 0: keep the last."""
    select_episodes: PositiveCount = 10
    """Episodes per selection evaluation (seeds train.eval_seed.., never the final evaluation's)."""
    student_states: Count = 0
    """distill: after every student_states_interval gradient steps, the model plays this many
    environment steps greedily and the baseline labels the states it visits; half of each later
    batch comes from those states (DAgger). Teaches a student where its own errors lead, which
    replay states never show it. 0: replay states only. Images and frame stacks too: the
    student plays the environment as training built it."""
    student_states_interval: PositiveCount = 5000
    """Gradient steps between the student's plays (see student_states)."""

    @model_validator(mode="after")
    def _states_need_distillation(self) -> FineTuneConfig:
        if self.student_states and self.method != "distill":
            raise ValueError("student_states labels states with the baseline: it needs method: distill")
        return self


class CandidatesConfig(StrictModel):
    """Build the variant `count` times and keep the build that plays best on fresh episodes.

    Why: a fine-tuned build is one draw of its seed, and builds of one variant can land on both
    sides of the margin; a paired difference on fresh episodes ranks builds much as the full
    evaluation does (docs/students.md, benchmarks/student_replicas.py). Candidate k is built as a
    variant named NAME.cK would be (its seeds follow its name), without loading a pruning other
    variants share."""

    count: _count(2) = 3
    """Builds to choose from; the variant costs that many builds."""
    episodes: PositiveCount = 200
    """Fresh episodes each candidate plays (seeds seed..); the baseline plays them too, paired."""
    seed: Count = 200000
    """First seed of those episodes: apart from the evaluation's, the selection's and the held-out ones."""
    qat_teachers: list[QatTeacher] | None = None
    """QAT each build's float model once per teacher listed (quantize.qat_teacher), each result a
    candidate: `count` builds give count x len(qat_teachers) candidates for the cost of `count`
    distillations: a second QAT is another draw for less than another distillation (on MinAtar
    Breakout it kept no better build than QAT to the baseline, docs/minatar.md). null: the
    variant's quantize.qat_teacher alone."""

    @model_validator(mode="after")
    def _distinct_teachers(self) -> CandidatesConfig:
        if self.qat_teachers is not None and (not self.qat_teachers or len(set(self.qat_teachers)) != len(self.qat_teachers)):
            raise ValueError("candidates.qat_teachers: list each teacher once, e.g. [baseline, float]")
        return self


class VariantConfig(StrictModel):
    """One compressed policy built from the trained baseline."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    """Letters, digits, '.', '_' and '-' (it names a directory inside the run)."""
    prune: PruneConfig | None = None
    quantize: QuantizeConfig | None = None
    cluster: ClusterConfig | None = None
    student: StudentConfig | None = None
    fine_tune: FineTuneConfig | None = None
    candidates: CandidatesConfig | None = None
    """Build it several times and keep the best on fresh episodes (see CandidatesConfig)."""

    @model_validator(mode="after")
    def _combinable(self) -> VariantConfig:
        if self.name in ("baseline", "random"):
            raise ValueError(f"name {self.name!r} is reserved (the trained baseline and the uniform-random "
                             "reference are reported under those names); rename the variant")
        if self.prune and self.cluster:
            raise ValueError("prune and cluster in one variant are not supported; make two variants")
        if self.cluster and not self.student and (self.cluster.steps or self.cluster.learning_rate):
            raise ValueError("cluster.steps and cluster.learning_rate tune a student after its distillation; "
                             "a clustered copy of the baseline uses fine_tune.steps and fine_tune.learning_rate")
        needs_tuning = self.prune or self.cluster or self.student or (self.quantize and self.quantize.mode == "qat")
        if needs_tuning and self.fine_tune is None:
            self.fine_tune = FineTuneConfig()
        if self.student and self.fine_tune and self.fine_tune.method != "distill":
            raise ValueError("a student learns from the baseline: fine_tune.method must be distill")
        if self.quantize and self.quantize.qat_teacher == "float" and self.fine_tune.method != "distill":
            raise ValueError("quantize.qat_teacher: float distils to the float model: fine_tune.method must be distill")
        if self.quantize and self.quantize.kernel_bits and self.quantize.preserve and (self.prune or self.cluster):
            raise ValueError("quantize.kernel_bits has no sparsity- or cluster-preserving QAT; drop kernel_bits, "
                             "or set quantize.preserve: false")
        self._candidate_teachers()
        if not (self.prune or self.quantize or self.cluster or self.student):
            raise ValueError("a variant needs at least one of prune, quantize, cluster, student")
        return self

    def _candidate_teachers(self) -> None:
        teachers = self.candidates.qat_teachers if self.candidates else None
        if teachers is None:
            return
        if not (self.quantize and self.quantize.mode == "qat"):
            raise ValueError("candidates.qat_teachers: QAT's teachers need quantize.mode: qat; remove it or use mode qat")
        if self.quantize.qat_teacher != "baseline":
            raise ValueError("give the QAT teacher once: candidates.qat_teachers or quantize.qat_teacher, not both")
        if "float" in teachers and self.fine_tune.method != "distill":
            raise ValueError("candidates.qat_teachers: float distils to the float model: fine_tune.method must be distill")


def _tuning(steps: int, learning_rate: float) -> Any:
    return Field(default_factory=lambda: FineTuneConfig(steps=steps, learning_rate=learning_rate))


class VariantTemplate(StrictModel):
    """A variant less its name: the settings every rung of a search family shares. Each rung is
    this variant with what its family varies, named for its settings (run.ladders.variant_name). A
    key given replaces that key's default whole."""

    fine_tune: FineTuneConfig | None = None
    quantize: QuantizeConfig | None = None
    cluster: ClusterConfig | None = None
    candidates: CandidatesConfig | None = None
    """Build each rung several times and keep the best on fresh episodes (as a variant's candidates)."""

    def variant(self, **varied: Any) -> VariantConfig:
        """The variant a rung is: these settings and what it varies (a student, a prune target), unnamed."""
        try:
            return VariantConfig.model_validate({**self.model_dump(), "name": "rung", **varied})
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, limit=1)) from None

    def _check(self) -> None:
        self.variant()

    @model_validator(mode="after")
    def _a_variant(self) -> VariantTemplate:
        """A template that cannot make a variant is refused with the recipe, not at its first rung."""
        self._check()
        return self


_QAT = {"mode": "qat", "qat_steps": 5_000, "qat_learning_rate": 1e-4}
"""The search's QAT unless told otherwise: a quarter of the students' distillation, at a tenth of its step size."""
_PRUNE_DENSE = [layer_names.hidden(0), layer_names.OUTPUT]
"""The pruned family's dense layers unless told: an MLP's small input and output layers."""


class StudentTemplate(VariantTemplate):
    """How each of search.students is built: distilled from the baseline (fine_tune), then quantized."""

    fine_tune: FineTuneConfig | None = _tuning(20_000, 1e-3)
    """The distillation."""
    quantize: QuantizeConfig | None = Field(default_factory=lambda: QuantizeConfig(**_QAT))
    """int8 after a quantization-aware fine-tune (its own steps, a smaller step size); null: float students."""

    def rung(self, student: StudentConfig) -> VariantConfig:
        return self.variant(student=student)

    def _check(self) -> None:
        qat = self.quantize is not None and self.quantize.mode == "qat"
        if self.cluster is not None and not qat:
            raise ValueError("cluster: clustered students keep their clusters through quantization-aware int8; "
                             "set quantize: {mode: qat} or remove cluster")
        if qat and self.quantize.kernel_bits and self.cluster is not None:
            raise ValueError("quantize.kernel_bits: low-bit kernels are trained by QAT without clustering; "
                             "remove cluster or kernel_bits")
        self.rung(StudentConfig(net_arch=[1]))


class PrunedTemplate(VariantTemplate):
    """How the baseline is pruned to each of search.sparsities, recovered (fine_tune) and quantized."""

    prune: PruneSettings = Field(default_factory=lambda: PruneSettings(exclude=_PRUNE_DENSE))
    """Layers kept dense (by default the small input and output layers) and how pruning ramps."""
    fine_tune: FineTuneConfig | None = _tuning(6_000, 3e-4)
    """The recovery fine-tune, during which pruning reaches its target."""
    quantize: QuantizeConfig | None = Field(default_factory=lambda: QuantizeConfig(mode="int8"))
    """Post-training int8. dynamic keeps float activations: on MinAtar Space Invaders int8 activations
    cost the pruned baseline its return and int8 weights alone did not (docs/minatar.md); qat keeps
    the sparsity through quantization-aware int8."""

    def rung(self, sparsity: float) -> VariantConfig:
        return self.variant(prune={**self.prune.model_dump(), "sparsity": sparsity})

    def _check(self) -> None:
        if self.cluster is not None:
            raise ValueError("cluster: a pruned rung is not clustered too; remove cluster (a student may be)")
        self.rung(0.5)


_OLD_SEARCH_KEYS = ("student_quantize", "student_fine_tune", "student_candidates", "student_cluster",
                    "student_kernel_bits", "prune_exclude", "prune_fine_tune", "prune_quantize", "prune_sparse_format",
                    "qat_steps", "qat_learning_rate", "qat_float_head", "qat_teacher")
"""search: keys before the families were templates (issue 60), read into the templates."""


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
        return dict(_QAT)
    return {"mode": "qat", **{key: student_quantize[key] for key in keys if key in student_quantize}}


def _quantize(quantize: Any, mode: str | None, old: dict[str, Any], qat: Any = _QAT, float_head: bool = True) -> Any:
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
    quantize = _quantize(student.get("quantize", dict(_QAT)), old.get("student_quantize"), old)
    bits, teacher = old.get("student_kernel_bits"), old.get("qat_teacher")
    if _is_qat(quantize):
        quantize = {**quantize, **({"kernel_bits": bits} if bits else {}),
                    **({"qat_teacher": teacher} if teacher in ("baseline", "float") else {})}
        if teacher == "both" and isinstance(student.get("candidates"), dict):
            student["candidates"] = {**student["candidates"], "qat_teachers": ["baseline", "float"]}
    elif bits:
        raise ValueError("student_kernel_bits: low-bit kernels are trained by QAT without clustering; "
                         "set student_quantize: qat and remove student_cluster, or remove student_kernel_bits")
    if teacher == "both" and not (_is_qat(quantize) and isinstance(student.get("candidates"), dict)):
        raise ValueError("qat_teacher: both makes each QAT build two candidates: it needs student_quantize: qat and "
                         "student_candidates (now written student: {quantize: {mode: qat}, candidates: {qat_teachers: "
                         "[baseline, float]}})")
    return {**student, "quantize": quantize}


def _templates_from_old_keys(data: Any) -> Any:
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
        prune = dict(pruned.get("prune") or {"exclude": _PRUNE_DENSE})
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


class SearchConfig(StrictModel):
    """Find the smallest policy that keeps the baseline's return on every training seed.

    Each family is a ladder of candidates ordered by size: the students, the baseline pruned to
    each sparsity, and the quantized baseline (one rung). A family's rungs are one variant
    template (student, pruned, quantized_baseline) with what the ladder varies, each named for its
    settings (student-32x32-qat-int8, prune-90-int8, qat-int8). The search bisects each ladder for
    its smallest rung within eval.tolerance (assuming a smaller rung never keeps more return), and
    skips a rung that cannot beat the best policy found so far. The earlier keys (student_quantize,
    prune_fine_tune, qat_steps, ...) are still read, into the templates."""

    objective: Literal["gzip_bytes", "params", "latency"] = "gzip_bytes"
    """What "smallest" means: the gzipped .tflite bytes, the nonzero parameters, or the TFLite
    batch-1 p50 latency on this machine."""
    students: list[list[PositiveCount] | StudentConfig] = Field(
        default_factory=lambda: [[64, 64], [32, 32], [16, 16], [8, 8]])
    """Students to try (distilled from the baseline): hidden widths, an MLP on the flattened
    observation ([32, 32]), or a network with conv layers for images ({conv: [{filters: 8,
    kernel: 3}], net_arch: [32]}); [] leaves students out."""
    student: StudentTemplate = Field(default_factory=StudentTemplate)
    """How every student is built: a variant less its name and network (fine_tune, quantize,
    cluster, candidates)."""
    sparsities: list[_real(0.0, 1.0, lo_open=True, hi_open=True)] = Field(default_factory=list)
    """Magnitude-pruning targets to try on the baseline; [] leaves pruning out."""
    shrunk: list[list[PositiveCount] | StudentConfig] = Field(default_factory=list)
    """The baseline narrowed to each shape (structured pruning): it keeps its best-ranked filters and
    units with their weights (a student's from_teacher, gap unless an entry names another), then is
    built as `student:` says. Widths for an MLP baseline ([64, 64]); for a CNN, its conv layers with
    fewer filters ({conv: [{filters: 8, kernel: 3}], net_arch: [32]}); [] leaves it out."""
    pruned: PrunedTemplate = Field(default_factory=PrunedTemplate)
    """How every pruned rung is built: a variant less its name and sparsity (prune, fine_tune, quantize)."""
    quantized_baseline: VariantTemplate | None = None
    """The whole baseline quantized, a one-rung family: {quantize: {mode: int8}} (ptq-int8) or
    {quantize: {mode: qat, ...}, fine_tune: {...}} (qat-int8); null: none. Where no student or
    pruning keeps the return (MinAtar Breakout, docs/minatar.md), it is the smallest policy that
    does; where one does, it is skipped unplayed, being larger."""
    max_candidates: _count(1) | None = None
    """Budget: candidates evaluated at most (each on every seed); null: no limit."""
    max_seconds: _real(0.0, None, lo_open=True) | None = None
    """Budget: no new candidate starts after this many seconds of search; null: no limit."""

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return _templates_from_old_keys(data)

    @model_validator(mode="after")
    def _something_to_try(self) -> SearchConfig:
        if not self.students and not self.shrunk and not self.sparsities and self.quantized_baseline is None:
            raise ValueError("search: give students, shrunk, sparsities or quantized_baseline; nothing to try")
        for key in ("students", "shrunk"):
            if any(not (s.net_arch if isinstance(s, StudentConfig) else s) for s in getattr(self, key)):
                raise ValueError(f"search.{key}: each entry is a list of hidden widths, e.g. [32, 32], or "
                                 "{conv: [...], net_arch: [...]} with at least one hidden width")
        return self

    def templates(self) -> dict[str, VariantTemplate]:
        """Each family's template, by the recipe's key."""
        found = {"student": self.student, "pruned": self.pruned, "quantized_baseline": self.quantized_baseline}
        return {key: template for key, template in found.items() if template is not None}


class MeasureConfig(StrictModel):
    """What the measuring stage probes besides size and latency."""

    saved_model_memory: Literal["all", "baseline", "none"] = "all"
    """Whose SavedModel inference memory is probed: every policy's, the baseline's only, or none
    (smoke runs and tests that read no memory figure). Each probe is a fresh process that imports
    TensorFlow, and TensorFlow's runtime is most of the figure and much the same for every policy,
    so "baseline" spares a quick run those imports and still shows what serving through TensorFlow
    takes (docs/measurements.md). Every policy's TFLite memory is probed either way."""
    c_policy: Literal["all", "none"] = "all"
    """Whether each policy's flash and RAM as generated C are measured (where the `c` extra is installed):
    "none" still translates the policy (results.json says whether it translates and is integer-only) but
    cross-compiles nothing; for smoke runs and tests that read no C figure, as a large CNN's C source
    takes seconds per target to compile."""
    micro: Literal["all", "none"] = "all"
    """Whether each policy's TensorFlow Lite Micro arena is measured (where the `micro` extra is installed):
    "none" records the model's flash only, with the reason; for smoke runs and tests that read no MCU figure
    (measuring runs the policy in TFLM at shrinking arena sizes, a fraction of a second per policy)."""


class Recipe(StrictModel):
    """One experiment: environment, training, replay, evaluation."""

    name: str = Field(default="run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Run name (letters, digits, '.', '_' and '-'); defaults to the recipe file's stem."""
    seed: Seed = 0
    """Seeds the environment, exploration, replay sampling and network initialisation."""
    seeds: list[Seed] | None = None
    """Train and compress once per seed (RUN_DIR/seed-N) and aggregate over seeds with the
    interquartile mean and stratified-bootstrap CIs (rliable); overrides `seed`."""
    env: EnvConfig
    baseline: BaselineConfig | None = None
    """Compress a Q-network trained elsewhere (then train: is not run; its gamma, batch_size,
    buffer_size, ... still set TD fine-tunes and the replay buffer)."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    variants: list[VariantConfig] = Field(default_factory=list)
    """Compressed policies to build from the baseline, each exported and evaluated."""
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    search: SearchConfig | None = None
    """Search for the smallest policy that keeps the return (besides the listed variants)."""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """Where TensorFlow trains: auto (a GPU when one is visible), cpu, or gpu (fails without one)."""
    executor: Literal["local", "ray"] = "local"
    """How several seeds run: local (a process pool sized to the machine) or ray (Ray Core tasks)."""
    address: str | None = None
    """Ray cluster to join (e.g. ray://head:10001 or auto); null starts a local Ray. executor: ray only."""
    workers: _count(1) | None = None
    """Units run at once: seeds, or a single-seed run's variants (null: one per CPU, fewer where
    memory is short)."""

    @model_validator(mode="after")
    def _seeds_apart(self) -> Recipe:
        if self.address is not None and self.executor != "ray":
            raise ValueError(f"address: {self.address!r} joins a Ray cluster; set executor: ray or remove it")
        if self.seeds is not None and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise ValueError(f"seeds: {self.seeds} must be a non-empty list of distinct seeds")
        names = [v.name for v in self.variants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"variants: names must be unique; repeated: {', '.join(duplicates)}")
        evaluation, selection = self._episode_ranges()
        if selection is not None:
            (lo, hi), (start, end) = selection, evaluation
            if lo < end and start < hi:
                raise ValueError(
                    f"train.eval_seed range [{lo}, {hi}) overlaps eval.seed range "
                    f"[{start}, {end}); move train.eval_seed "
                    "so model selection never sees the final evaluation episodes"
                )
        others = [("eval.seed", *evaluation), ("eval.heldout_seed", self.eval.heldout_seed,
                                               self.eval.heldout_seed + self.eval.heldout_episodes)]
        if selection is not None:
            others.append(("train.eval_seed", *selection))
        picks = [(f"variants.{i}.candidates.seed", f"variant {v.name}", v.candidates) for i, v in enumerate(self.variants)]
        if self.search is not None:
            whose = {"student": "the search's students", "pruned": "the search's pruned rungs",
                     "quantized_baseline": "the search's quantized baseline"}
            picks += [(f"search.{key}.candidates.seed", whose[key], template.candidates)
                      for key, template in self.search.templates().items()]
        for where, whose, candidates in picks:  # candidates are picked on fresh episodes
            if candidates is None:
                continue
            lo, hi = candidates.seed, candidates.seed + candidates.episodes
            for key, start, end in others:
                if lo < end and start < hi:
                    raise ValueError(f"{where}: the fresh episodes [{lo}, {hi}) of {whose} overlap {key}'s "
                                     f"[{start}, {end}); move candidates.seed so the pick plays fresh episodes")
        return self

    @model_validator(mode="after")
    def _exclude_names(self) -> Recipe:
        """A typo in prune/cluster.exclude was found only after the baseline had trained (and the
        corrected rerun was then refused as a different recipe). A network this recipe builds has
        known layer names; a brought baseline's are checked once it is loaded."""
        if self.baseline is not None:
            return self

        for i, variant in enumerate(self.variants):
            arch = variant.student or self.train
            known = layer_names.weight_layers(len(arch.conv), len(arch.net_arch))
            for key in ("prune", "cluster"):
                technique = getattr(variant, key)
                unknown = [n for n in (technique.exclude if technique else []) if n not in known]
                if unknown:
                    raise ValueError(f"variants.{i}.{key}.exclude: no layer named {', '.join(unknown)} in "
                                     f"{variant.name}'s network; its layers are {', '.join(known)}")
        return self

    def _episode_ranges(self) -> tuple[tuple[int, int], tuple[int, int] | None]:
        """[first, end) seeds of the evaluation (every look's episodes) and of model selection
        (train.eval_seed.., None where nothing selects: no periodic evaluation, no select_interval)."""
        evaluation = (self.eval.seed, self.eval.seed + max(self.eval.episodes, self.eval.max_episodes or 0))
        selecting = [v.fine_tune.select_episodes for v in self.variants if v.fine_tune and v.fine_tune.select_interval]
        if self.search is not None:
            selecting += [t.fine_tune.select_episodes for t in self.search.templates().values()
                          if t.fine_tune and t.fine_tune.select_interval]
        if not (self.train.eval_interval or selecting):
            return evaluation, None
        width = max([self.train.eval_episodes if self.train.eval_interval else 0, *selecting])
        return evaluation, (self.train.eval_seed, self.train.eval_seed + width)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as written to the run directory's recipe.yaml."""
        return self.model_dump(mode="json", by_alias=True)


# ---------------------------------------------------------------------------------------------
# Loading and error formatting
# ---------------------------------------------------------------------------------------------


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _format_error(error: Any) -> str:
    loc = ".".join(str(part) for part in error["loc"])
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "unknown_key":
        where = f"{loc}.{ctx['key']}" if loc else ctx["key"]
        return f"{where}: {error['msg']}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{loc or 'recipe'}: expected a mapping of keys, got {value!r}"
    message = error["msg"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        return f"{loc}: {message}" if loc else message
    if kind == "literal_error":
        return f"{loc}: {value!r} is not allowed; expected {ctx.get('expected', message)}"
    if kind in _BOUNDS:
        ((bound, limit),) = ctx.items()
        return f"{loc}: {value!r} must be {_BOUNDS[kind]} {limit if isinstance(limit, int) else format(limit, 'g')}"
    if kind in ("byte_size", "byte_size_unit"):
        return (f"{loc}: {value!r} is not a size; write a whole number of bytes or a number with a unit from "
                "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. 512MiB)")
    return f"{loc}: {value!r} is invalid: {message[0].lower()}{message[1:]}"


def format_validation_error(exc: ValidationError, limit: int = 3) -> str:
    """One line: the first few problems, each as `dotted.key: what is wrong; what is allowed`."""
    errors = exc.errors(include_url=False)
    text = "; ".join(_format_error(e) for e in errors[:limit])
    if len(errors) > limit:
        text += f" (and {len(errors) - limit} more)"
    return text.replace("\n", " ")


def _apply_override(data: dict[str, Any], override: str) -> None:
    """Apply `train.gamma=0.9` (the value is read as YAML) to the raw recipe data; `variants.NAME.key`
    reaches into the variant of that name."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {override!r}: write KEY=VALUE, e.g. --set train.total_timesteps=1000")
    try:
        value = read_yaml_text(raw, f"--set {key.strip()}")
    except UserError:
        if raw.lstrip().startswith(("&", "*", "[", "{")):  # YAML that failed a guard, not a plain string
            raise
        value = raw
    node = data
    parts = key.strip().split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if part == "variants" and isinstance(child, list):  # variants.NAME.key: the variant of that name
            child = {v.get("name"): v for v in child if isinstance(v, dict)}
            if parts[i + 1] not in child:
                raise UserError(f"--set {override!r}: the recipe has no variant named {parts[i + 1]!r}")
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set {override!r}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def recipe_from_data(data: Any, source: str = "recipe", overrides: tuple[str, ...] = ()) -> Recipe:
    """Validate already-parsed recipe data (used by load_recipe and by resume checks)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of keys at the top level, got {type(data).__name__}")
    for override in overrides:
        _apply_override(data, override)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{source}: {format_validation_error(exc)}") from None
    except RecursionError:
        raise UserError(f"{source}: recipe nests too deeply (recursive anchors?)") from None


def load_recipe(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> Recipe:
    """Load and validate a recipe file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path)
    if isinstance(data, dict) and "name" not in data:
        data["name"] = re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip(".-_") or "run"
    recipe = recipe_from_data(data, str(path), tuple(overrides))
    if recipe.baseline is not None:  # files named in a recipe are relative to the recipe
        here = path.absolute().parent
        update = {"from_": str(here / Path(recipe.baseline.from_).expanduser())}
        if recipe.baseline.transitions is not None:
            update["transitions"] = str(here / Path(recipe.baseline.transitions).expanduser())
        for key, value in update.items():  # refuse a missing file before anything is written
            if not Path(value).exists():
                name = "from" if key == "from_" else key
                raise UserError(f"baseline.{name}: {value}: no such file or directory; check the path "
                                "(relative paths are taken from the recipe's folder)")
        recipe = recipe.model_copy(update={"baseline": recipe.baseline.model_copy(update=update)})
    return recipe
