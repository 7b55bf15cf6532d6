"""Import boundaries of DESIGN.md §2, checked on the source (function-level imports too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "reef"

# Every part of reef but ``core``: what ``core`` and ``db`` must never import.
DOMAIN = {
    "config",
    "experience",
    "releases",
    "harness",
    "upstream",
    "engine",
    "gateway",
    "learning",
    "evaluation",
    "jobs",
    "cli",
    "dashboard",
    "client",
    "environments",
    "telemetry",
    "quickstart",
}

# package -> packages (or third-party roots) it must never import
FORBIDDEN: dict[str, set[str]] = {
    "core": DOMAIN | {"db"},
    "db": DOMAIN,
    "config": {"gateway", "learning"},
    "experience": {"gateway", "learning", "torch"},
    "releases": {"gateway", "learning", "torch"},
    "harness": {"gateway", "learning", "torch"},
    "upstream": {"experience", "learning"},
    "engine": {"gateway", "experience", "cli"},
    "gateway": {"learning", "torch"},
    "learning": {"gateway"},
    "evaluation": {"gateway", "learning", "torch"},
    "dashboard": {"learning", "torch"},
    "client": {"gateway", "learning", "engine", "experience", "torch"},
    "jobs": {"gateway", "learning", "evaluation", "torch"},
    # Live export reads records and feedback; it serves no request and learns nothing.
    "telemetry": {"gateway", "learning", "torch", "db", "cli"},
    # Environments are what the gate and the learners play episodes in: they import
    # neither, nor the server or the stores the episodes' records land in.
    "environments": {
        "gateway",
        "learning",
        "evaluation",
        "torch",
        "engine",
        "cli",
        "releases",
        "jobs",
        "db",
    },
}
HEAVY = {"torch", "transformers", "peft"}

# The stores that sit side by side on one ``reef.db.Database``: none imports another's
# package (each gets the database from the composition root, not through a sibling).
STORES = ("experience", "releases", "jobs")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _targets(names: set[str]) -> set[str]:
    """Reef sub-packages and heavy third-party roots named by ``names``."""
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == "reef" and len(parts) > 1:
            out.add(parts[1])
        elif parts[0] in HEAVY:
            out.add(parts[0])
    return out


def test_every_package_exists_with_an_owner_docstring() -> None:
    for package in [*FORBIDDEN, "cli"]:
        init = SRC / package / "__init__.py"
        assert init.exists(), f"missing package reef.{package}"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert doc, f"reef.{package} has no docstring"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_its_import_boundary(package: str) -> None:
    violations = []
    for path in sorted((SRC / package).rglob("*.py")):
        bad = _targets(_imports(path)) & FORBIDDEN[package]
        if package == "experience" or package == "releases" or package == "harness":
            bad |= _targets(_imports(path)) & HEAVY
        if bad:
            violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_torch_lives_only_in_engine_and_trainers() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("engine/", "learning/trainers/")):
            continue
        heavy = _targets(_imports(path)) & HEAVY
        if heavy:
            offenders.append(f"{rel} imports {sorted(heavy)}")
    assert not offenders, "\n".join(offenders)


def test_learning_knows_the_chat_format_without_the_engine() -> None:
    """The learners write conversations down in ``reef.core.chat_format``; only the
    trainers, which load the engine's model to train on it, import ``reef.engine`` (the
    format once lived in ``reef.engine.tools``)."""
    offenders = []
    for path in sorted((SRC / "learning").rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith("learning/trainers/") and "engine" in _targets(_imports(path)):
            offenders.append(rel)
    assert not offenders, f"import reef.core.chat_format instead: {offenders}"
    format_imports = _targets(_imports(SRC / "core" / "chat_format.py"))
    assert not format_imports, f"reef.core.chat_format imports {sorted(format_imports)}"


# Packages other packages reach only through their face (``reef.X``, its ``__all__``).
FACED = ("db", "environments", "evaluation", "experience", "jobs", "learning", "releases")


@pytest.mark.parametrize("package", FACED)
def test_other_packages_import_only_the_face(package: str) -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(f"{package}/"):
            continue
        inner = sorted(n for n in _imports(path) if n.startswith(f"reef.{package}."))
        if inner:
            offenders.append(f"{rel} imports {inner}")
    assert not offenders, f"import from reef.{package} instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("store", STORES)
def test_no_store_imports_another_store(store: str) -> None:
    """Experience, releases and jobs are stores side by side on ``reef.db``: the release
    chain and the job queue once imported ``reef.experience.schema``, ``.migrations`` and
    ``.sqlengine`` (the database lived inside the experience store)."""
    others = set(STORES) - {store}
    violations = []
    for path in sorted((SRC / store).rglob("*.py")):
        bad = _targets(_imports(path)) & others
        if bad:
            violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_no_store_is_reached_through_another() -> None:
    """Outside ``reef.db`` the SQLAlchemy engine is read only off a ``Database``
    (``database.engine``) — never ``store.engine`` or ``chain.engine``, the way
    ``JobQueue(chain.engine)`` and ``EvaluationStore(store.engine)`` once found it."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("db/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("engine", "database"):
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name in ("store", "chain", "queue", "evaluations", "responses", "jobs"):
                    offenders.append(f"{rel}:{node.lineno} reads {name}.{node.attr}")
    assert not offenders, "build each store on the Database instead:\n" + "\n".join(offenders)


def test_the_gateway_writes_no_sql() -> None:
    """The gateway reaches the database only through its stores' methods: no module
    of it imports SQLAlchemy (the insights routes held a 62-line join until 2026-12)."""
    offenders = [
        path.relative_to(SRC).as_posix()
        for path in sorted((SRC / "gateway").rglob("*.py"))
        if any(name.split(".")[0] in ("sqlalchemy", "alembic") for name in _imports(path))
    ]
    assert not offenders, f"import SQLAlchemy outside the gateway: {offenders}"


def _loaded_by(modules: str, wanted: str) -> list[str]:
    """The modules a fresh interpreter has loaded after ``import {modules}``, of those
    for which the expression ``wanted`` (on ``m``, a module name) is true."""
    code = f"import sys, {modules}\nprint(','.join(sorted(m for m in sys.modules if {wanted})))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return [name for name in result.stdout.strip().split(",") if name]


@pytest.mark.parametrize(
    "module",
    [
        "reef",
        "reef.gateway",
        "reef.cli.main",
        "reef.experience",
        "reef.core.chat_format",
        "reef.environments",
    ],
)
def test_import_loads_no_torch(module: str) -> None:
    heavy = _loaded_by(module, "m.split('.')[0] in {'torch', 'transformers', 'peft'}")
    assert not heavy, f"import {module} loaded {heavy}"


@pytest.mark.parametrize("module", ["reef", "reef.gateway", "reef.cli.main", "reef.telemetry"])
def test_import_loads_no_opentelemetry(module: str) -> None:
    """The OpenTelemetry SDK is an optional extra, loaded only when ``otel.enabled``."""
    loaded = _loaded_by(module, "m.split('.')[0] == 'opentelemetry'")
    assert not loaded, f"import {module} loaded {loaded}"


def test_the_database_loads_no_domain() -> None:
    """``import reef.db`` (and its migrations) loads nothing of reef but ``core``."""
    domain = _loaded_by(
        "reef.db, reef.db.migrations, reef.db.schema",
        "m.startswith('reef.') and m.split('.')[1] not in ('core', 'db')",
    )
    assert not domain, f"import reef.db loaded {domain}"
