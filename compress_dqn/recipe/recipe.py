"""The recipe as a whole: one experiment's blocks, where its runs go, and the checks that span blocks.

The cross-block checks: episode seed ranges kept apart (evaluation, held-out, model selection,
each candidates' pick: SeedRange.overlaps), unique variant names, and exclude lists naming layers
the network has.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue, model_validator

from compress_dqn.recipe import layer_names
from compress_dqn.recipe.env import EnvConfig
from compress_dqn.recipe.evaluation import EvalConfig, MeasureConfig
from compress_dqn.recipe.search import SearchConfig
from compress_dqn.recipe.seed_range import SeedRange
from compress_dqn.recipe.techniques import CandidatesConfig
from compress_dqn.recipe.train import BaselineConfig, ReplayConfig, TrainConfig
from compress_dqn.recipe.values import Name, Seed, StrictModel, count_from
from compress_dqn.recipe.variant import VariantConfig


class Recipe(StrictModel):
    """One experiment: environment, training, replay, evaluation."""

    name: Name = "run"
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
    workers: count_from(1) | None = None
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
        if selection is not None and selection.overlaps(evaluation):
            raise ValueError(
                f"train.eval_seed range {selection} overlaps eval.seed range {evaluation}; move train.eval_seed "
                "so model selection never sees the final evaluation episodes"
            )
        taken = [("eval.seed", evaluation), ("eval.heldout_seed", self.eval.heldout_range)]
        if selection is not None:
            taken.append(("train.eval_seed", selection))
        for where, whose, candidates in self._candidate_picks():  # candidates are picked on fresh episodes
            fresh = candidates.seed_range
            for key, seeds in taken:
                if fresh.overlaps(seeds):
                    raise ValueError(f"{where}: the fresh episodes {fresh} of {whose} overlap {key}'s "
                                     f"{seeds}; move candidates.seed so the pick plays fresh episodes")
        return self

    def _candidate_picks(self) -> list[tuple[str, str, CandidatesConfig]]:
        """(where, whose, candidates) of every candidates block: the variants', then the search families'."""
        picks = [(f"variants.{i}.candidates.seed", f"variant {v.name}", v.candidates) for i, v in enumerate(self.variants)]
        if self.search is not None:
            whose = {"student": "the search's students", "pruned": "the search's pruned rungs",
                     "quantized_baseline": "the search's quantized baseline"}
            picks += [(f"search.{key}.candidates.seed", whose[key], template.candidates)
                      for key, template in self.search.templates().items()]
        return [pick for pick in picks if pick[2] is not None]

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

    def _episode_ranges(self) -> tuple[SeedRange, SeedRange | None]:
        """The seeds of the evaluation (every look's episodes) and of model selection
        (train.eval_seed.., None where nothing selects: no periodic evaluation, no select_interval)."""
        selecting = [v.fine_tune.select_episodes for v in self.variants if v.fine_tune and v.fine_tune.select_interval]
        if self.search is not None:
            selecting += [t.fine_tune.select_episodes for t in self.search.templates().values()
                          if t.fine_tune and t.fine_tune.select_interval]
        if not (self.train.eval_interval or selecting):
            return self.eval.seed_range, None
        width = max([self.train.eval_episodes if self.train.eval_interval else 0, *selecting])
        return self.eval.seed_range, SeedRange.of(self.train.eval_seed, width)

    def to_dict(self) -> dict[str, JsonValue]:
        """Plain data, as written to the run directory's recipe.yaml."""
        return self.model_dump(mode="json", by_alias=True)
