"""kubernetes-asyncio, loaded by the piece: import it from here, never directly.

The generated client's package ``__init__`` files import every API group and every model as
soon as anything under ``kubernetes_asyncio`` is imported (the maintainers' own account of the
cost: tomplus/kubernetes_asyncio#293; what it costs the daemon is in benchmarks/README.md).
The controller calls four API groups and reads a handful of models. Before the package is
first imported, this module puts light stand-ins for those four package ``__init__`` modules in
``sys.modules``: each knows, from the real ``__init__``'s own import lines, which submodule
defines each name, and imports that submodule the first time the name is used. Everything else
is the library's own code, unchanged: ``client.CoordinationV1Api`` is the real class, and the
deserialiser's ``getattr(kubernetes_asyncio.client.models, "V1Lease")`` loads ``v1_lease`` and
nothing more.

If ``kubernetes_asyncio`` was already imported (a test or a tool did it first), nothing is
replaced and the full package is used.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import re
import sys
import types
from pathlib import Path

# ``from kubernetes_asyncio.client.api.core_v1_api import CoreV1Api`` and, at the top level,
# ``import kubernetes_asyncio.client as client``.
_FROM_IMPORT = re.compile(r"^from (kubernetes_asyncio[\w.]*) import (\w+)\s*$", re.MULTILINE)
_VERSION = re.compile(r"^__version__ = [\"']([^\"']+)[\"']", re.MULTILINE)
_PACKAGES = (
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
)


class _LazyPackage(types.ModuleType):
    """A package whose names are imported from their defining submodule on first use."""

    def __init__(self, name: str, directory: Path, sources: dict[str, str]) -> None:
        super().__init__(name)
        self.__path__ = [str(directory)]
        self.__file__ = str(directory / "__init__.py")
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        self.__spec__.submodule_search_locations = self.__path__
        self._sources = sources

    def __getattr__(self, attribute: str) -> object:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        source = self._sources.get(attribute)
        try:
            if source is None:  # a submodule: ``client.exceptions``, ``kubernetes_asyncio.config``
                value: object = importlib.import_module(f"{self.__name__}.{attribute}")
            else:
                value = getattr(importlib.import_module(source), attribute)
        except ModuleNotFoundError as exc:
            raise AttributeError(
                f"module {self.__name__!r} has no attribute {attribute!r}"
            ) from exc
        setattr(self, attribute, value)
        return value


def install() -> bool:
    """Put the stand-ins in place; ``False`` when the real package is already loaded (or not
    laid out as expected, in which case the normal import happens)."""
    if "kubernetes_asyncio" in sys.modules:
        return False
    spec = importlib.util.find_spec("kubernetes_asyncio")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    stand_ins: dict[str, _LazyPackage] = {}
    for name in _PACKAGES:
        directory = root.joinpath(*name.split(".")[1:])
        try:
            text = (directory / "__init__.py").read_text(encoding="utf-8")
        except OSError:
            return False
        sources = {attr: module for module, attr in _FROM_IMPORT.findall(text)}
        package = _LazyPackage(name, directory, sources)
        if version := _VERSION.search(text):
            package.__version__ = version.group(1)  # type: ignore[attr-defined]
        stand_ins[name] = package
    sys.modules.update(stand_ins)
    for name, package in stand_ins.items():  # the import system links parents to children
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(stand_ins[parent], child, package)
    return True


install()

from kubernetes_asyncio import client as client  # noqa: E402
from kubernetes_asyncio import config as config  # noqa: E402
from kubernetes_asyncio import watch as watch  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException as ApiException  # noqa: E402
