"""The README stays a user's guide and docs/ its studies: links resolve, named files exist, no scratch paths.

Why: the README had drifted (a module map missing files, figures citing paths that existed on one
machine). These checks read text only, so they cost milliseconds.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
PAGES = [README, *DOCS]

# A path under a machine's scratch or home directory means a figure that only one machine can
# reproduce; docs name the command instead.
SCRATCH = re.compile(r"(?:^|[\s`(\"'])/(?:tmp|work|home)/")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(r"\b((?:compress_dqn|benchmarks|recipes|tests)/[\w/.-]+\.(?:py|yaml))\b")
# The README's own line budget: a guide, with studies in docs/ (issue 34 asked for ~300 lines).
README_MAX_LINES = 330


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_docs_exist():
    assert DOCS, "docs/ holds the studies the README points to"


@pytest.mark.parametrize("page", PAGES + RECIPES, ids=_rel)
def test_no_scratch_paths(page):
    hits = [f"{_rel(page)}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if SCRATCH.search(line)]
    assert not hits, "name the command that reproduces it instead of a scratch path: " + "; ".join(hits)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    targets = [t for t in LINK.findall(page.read_text()) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{_rel(page)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES + RECIPES, ids=_rel)
def test_named_repository_files_exist(page):
    named = {n for n in REPO_PATH.findall(page.read_text()) if not re.search(r"/[A-Z]+\.", n)}  # not recipes/NAME.yaml
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"{_rel(page)} names files that do not exist (moved?): {missing}"


def test_readme_is_a_guide():
    text = README.read_text()
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move studies and figures to docs/"
    for command in ("make demo", "make test"):
        assert command in text, f"README.md lost the quick start's `{command}`"


def test_every_benchmark_is_documented():
    text = "\n".join(page.read_text() for page in PAGES)
    undocumented = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"benchmarks/{p.name}" not in text
                    and f"`{p.name}`" not in text]
    assert not undocumented, f"benchmarks with no word in README.md or docs/: {undocumented}"


REFERENCE_PAGES = {"architecture.md", "results.md"}
"""Reference pages (the package's layout, results.json's fields): no figures, so no machine or command."""


@pytest.mark.parametrize("page", [d for d in DOCS if d.name not in REFERENCE_PAGES], ids=_rel)
def test_every_study_names_its_command_and_machine(page):
    text = page.read_text()
    assert "**Machine:**" in text, f"{_rel(page)}: say which machine the figures come from (or 'not recorded')"
    assert re.search(r"\*\*(Command|Commands|Benchmark):\*\*", text), f"{_rel(page)}: name the command that reproduces it"
