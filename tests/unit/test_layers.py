"""Data flows one way, and so do imports: no module imports one from a layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "controller"

# Lowest first. A module may import its own layer and the ones below, never one above.
LAYERS = [
    {
        "controller",
        "__version__",
        "CONFIG_ENV",
        "model",
        "errors",
        "logs",
        "cgroup",
        "conditions",
        "exposition",
        "families",
        "engines",
        "fakes",
    },
    {"settings", "histograms", "addresses", "metrics", "churn"},
    {"sources", "health", "signals", "weights", "state"},
    {"render", "kube"},
    {"publish"},
    {"reconcile", "exporter"},
    {"server", "app", "testing"},
    {"demo", "simulation", "replay", "recorded", "status", "cli", "__main__"},
]
# The daemon's own path (everything up to the wiring) never imports the fakes.
DAEMON = 6


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else module
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("controller")
        ):
            found.add(node.module)
            if node.module == "controller":
                found |= {f"controller.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("controller")}
    return found - {"controller"}


def test_no_module_imports_from_a_layer_above_it() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(("controller", *path.relative_to(PACKAGE).with_suffix("").parts))
        name = name.removesuffix(".__init__")
        own = layer_of(name)
        for imported in imports(path):
            theirs = layer_of(imported)
            if theirs > own:
                wrong.append(f"{name} (layer {own}) imports {imported} (layer {theirs})")
            fake = imported.startswith("controller.fakes")
            if fake and own <= DAEMON and not name.startswith("controller.fakes"):
                wrong.append(f"{name} is on the daemon's path but imports {imported}")
    assert wrong == []


# Inside the packages with layers of their own, lowest first: a module imports its own layer
# and the ones below (a package's ``__init__`` that gathers its modules is its top).
INNER = {
    "sources": [
        {"__init__", "dns", "limiter", "page"},
        {"answers", "between", "http", "discovery"},
        {"reader", "prometheus"},
        {"scrape"},
    ],
    "reconcile": [{"__init__", "actuation", "realised", "journal"}, {"memory", "fleet"}, {"loop"}],
    "kube": [
        {"__init__", "sdk", "objects"},
        {"errors", "client"},
        {"informer", "access", "endpoints", "leader"},
        {"discovery", "pools"},
    ],
    "weights": [{"rounding"}, {"steps"}, {"capacity", "integral"}, {"__init__"}],
}


def inner_imports(package: str, path: Path) -> set[str]:
    """The modules of ``package`` that ``path`` imports (``__init__`` for the package)."""
    prefix = f"controller.{package}"
    mine = {p.stem for p in (PACKAGE / package).glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module == prefix:
            found |= {a.name if a.name in mine else "__init__" for a in node.names}
        elif node.module.startswith(prefix + "."):
            found.add(node.module[len(prefix) + 1 :].split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(INNER))
def test_no_module_imports_from_a_layer_above_it_inside_its_package(package: str) -> None:
    layers = INNER[package]
    where = {module: i for i, names in enumerate(layers) for module in names}
    modules = sorted(p.stem for p in (PACKAGE / package).glob("*.py"))
    assert set(modules) == set(where), f"{package}: place every module in INNER: {modules}"
    wrong = [
        f"{package}.{module} (layer {where[module]}) imports {package}.{other} "
        f"(layer {where[other]})"
        for module in modules
        for other in sorted(inner_imports(package, PACKAGE / package / f"{module}.py"))
        if where[other] > where[module]
    ]
    assert wrong == []
