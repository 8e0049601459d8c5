"""The YAML recipe as pydantic models: pure data, validated before anything runs; this module is their one face.

Each block lives in a module of its own (values, env, train, quantize, techniques, variant,
templates, search, old_search_keys, evaluation, recipe, loading); importers take the names from
here. Errors name the dotted key, the bad value and what is allowed, in one line. Nothing here
imports TensorFlow or numpy: `validate` and `--help` stay fast.
"""

from __future__ import annotations

from compress_dqn.recipe.env import AtariConfig, EnvConfig, atari_preprocessing, is_atari_id
from compress_dqn.recipe.evaluation import EvalConfig, MeasureConfig
from compress_dqn.recipe.loading import env_from_data, load_recipe, recipe_from_data
from compress_dqn.recipe.quantize import MODE_ONLY, QUANTIZE_MODES, KernelBits, QuantizeConfig
from compress_dqn.recipe.recipe import Recipe
from compress_dqn.recipe.search import SearchConfig
from compress_dqn.recipe.seed_range import SeedRange
from compress_dqn.recipe.techniques import (
    CandidatesConfig,
    ClusterConfig,
    FineTuneConfig,
    PruneConfig,
    PruneSettings,
    StudentConfig,
)
from compress_dqn.recipe.templates import PrunedTemplate, StudentTemplate, VariantTemplate
from compress_dqn.recipe.train import BaselineConfig, ConvLayer, ReplayConfig, RolloutConfig, TrainConfig
from compress_dqn.recipe.validation_errors import format_validation_error
from compress_dqn.recipe.values import (
    MAX_COUNT,
    ByteSize,
    Count,
    LearningRate,
    Name,
    PositiveCount,
    Probability,
    QatTeacher,
    Seed,
    StrictModel,
)
from compress_dqn.recipe.variant import VariantConfig

__all__ = [
    "MAX_COUNT", "MODE_ONLY", "QUANTIZE_MODES", "AtariConfig", "BaselineConfig", "ByteSize", "CandidatesConfig",
    "ClusterConfig", "ConvLayer", "Count", "EnvConfig", "EvalConfig", "FineTuneConfig", "KernelBits", "LearningRate",
    "MeasureConfig", "Name", "PositiveCount", "Probability", "PruneConfig", "PruneSettings", "PrunedTemplate",
    "QatTeacher", "QuantizeConfig", "Recipe", "ReplayConfig", "RolloutConfig", "SearchConfig", "Seed", "SeedRange",
    "StrictModel", "StudentConfig", "StudentTemplate", "TrainConfig", "VariantConfig", "VariantTemplate",
    "atari_preprocessing", "env_from_data", "format_validation_error", "is_atari_id", "load_recipe", "recipe_from_data",
]
