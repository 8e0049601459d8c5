"""The one way to run a recipe: a search where it has a `search:` block, one run per training seed
where it lists `seeds`, else one run. `run`, `compress` and `search` on the command line all come here."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from compress_dqn.recipe.schema import Recipe
from compress_dqn.run.pipeline import run
from compress_dqn.run.rundir import RunOutcome
from compress_dqn.run.search import run_search
from compress_dqn.run.seeds import run_seeds


def run_recipe(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Run (or resume, or extend) `recipe` in run_dir and return where it lives and what it produced."""
    if recipe.search:
        return run_search(recipe, run_dir, quiet=quiet, log=log)
    if recipe.seeds:
        return run_seeds(recipe, run_dir, quiet=quiet, log=log)
    return run(recipe, run_dir, quiet=quiet, log=log)
