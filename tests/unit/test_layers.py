"""Data flows one way, and so do imports: no module imports one from a layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

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
    {"demo", "simulation", "replay", "status", "cli", "__main__"},
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
