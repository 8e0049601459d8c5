"""docs/architecture.md names every module of the package, and names no module that is gone.

Why: the module map had drifted (issue 60: 14 modules missing). The doc's "Modules" section lists
each room (a sub-package, or "Top level") as a line such as "`deploy/` (...):" followed by an
indented block whose lines start with a module's path inside that room ("    micro/play.py   job").
These checks read text and list files only, so they cost milliseconds.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "compress_dqn"
DOC = ROOT / "docs" / "architecture.md"

ROOM = re.compile(r"^(?:`(?P<room>[\w/]+/)`|(?P<top>Top level)).*:\s*$")
ENTRY = re.compile(r"^ {4}(?P<path>[\w/]+\.py)\b")


def package_modules() -> set[str]:
    """Every module's path relative to the package, `__init__.py` files aside."""
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def documented_modules(text: str) -> set[str]:
    """The modules the doc's "Modules" section names, as paths relative to the package."""
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    named, room = set(), None
    for line in section.splitlines():
        if (found := ROOM.match(line)):
            room = found["room"] or ""
        elif room is not None and (entry := ENTRY.match(line)):
            named.add(room + entry["path"])
    return named


def test_the_doc_has_a_module_map():
    named = documented_modules(DOC.read_text())
    assert len(named) > 50, f"docs/architecture.md's Modules section names only {sorted(named)}: format changed?"


def test_every_module_is_named():
    missing = sorted(package_modules() - documented_modules(DOC.read_text()))
    assert not missing, ("docs/architecture.md's Modules section does not name these modules; add a line "
                         f"for each under its room, with its job: {missing}")


def test_every_named_module_exists():
    stale = sorted(documented_modules(DOC.read_text()) - package_modules())
    assert not stale, f"docs/architecture.md names modules that do not exist (renamed or removed?): {stale}"
