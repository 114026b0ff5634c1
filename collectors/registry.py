"""One list of engine plug-ins per layer, found by their folders, as node_exporter's collectors are.

An engine is a folder in each layer (``collectors/<name>/``, ``agent/<name>/``, ``reports/<name>/``)
with a ``plugin.py`` that exports ``ENGINE``, that layer's descriptor. The registry imports those
modules on first use, so the engine-neutral code names no engine, and a new engine touches only
its own folders. ``register`` adds one from elsewhere (a test's toy engine).

Only what a command uses is imported: ``find``/``get`` of one name import that engine's folder
alone (the folder is the engine's name), ``all`` every one. A descriptor's functions can be
``lazy("module:function")``, imported on first call, so a plug-in module need not import its
engine's analysis or renderers to describe them.

Pure and standard library only: reports may use it (it reads nothing of the machine), and the
probe ships it; inside the probe the modules come from memory, so the probe's loader lists them.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Generic, Iterator, List, Optional, Tuple, TypeVar

__all__ = ["Registry", "UnknownEngine", "lazy", "lazy_rows"]

P = TypeVar("P")
PLUGIN_MODULE = "plugin"


class UnknownEngine(KeyError):
    """A name no registered engine has."""


def _named(where: str) -> Any:
    """The attribute ``"module:attribute"`` names, its module imported now."""
    module, attr = where.split(":")
    return getattr(importlib.import_module(module), attr)


class lazy(object):  # noqa: N801 — reads as a function at the call site
    """A function named ``"module:attribute"``, imported on its first call (then called directly)."""

    __slots__ = ("where", "_target")

    def __init__(self, where: str) -> None:
        self.where = where
        self._target: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target = self._target
        if target is None:
            target = self._target = _named(self.where)
        return target(*args, **kwargs)

    def __repr__(self) -> str:
        return "lazy({!r})".format(self.where)


class lazy_rows(object):  # noqa: N801 — reads as a tuple at the call site
    """A tuple named ``"module:attribute"`` (an engine's log formats), imported on first use. The probe
    walks /proc on every host but reads a log only for an engine it found: its other engines' formats (their
    regexes compiled from source on the host) are never imported."""

    __slots__ = ("where", "_rows")

    def __init__(self, where: str) -> None:
        self.where = where
        self._rows: Optional[Tuple[Any, ...]] = None

    def _load(self) -> Tuple[Any, ...]:
        if self._rows is None:
            self._rows = tuple(_named(self.where))
        return self._rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __getitem__(self, index: Any) -> Any:
        return self._load()[index]

    def __repr__(self) -> str:
        return "lazy_rows({!r})".format(self.where)


class Registry(Generic[P]):
    """The plug-ins of one layer's package, by name, in name order (the first is the tie-breaker)."""

    def __init__(self, package: str) -> None:
        self._package = package
        self._found: Optional[Dict[str, P]] = None
        self._one: Dict[str, P] = {}  # engines imported alone, by find()
        self._folder_names: Optional[List[str]] = None
        self._extra: Dict[str, P] = {}

    def _folders(self) -> List[str]:
        pkg = importlib.import_module(self._package)
        lister = getattr(getattr(pkg, "__spec__", None) and pkg.__spec__.loader, "plugin_folders", None)
        if lister is not None:  # the probe: modules in memory, no folder on disk
            return list(lister(self._package))
        out = []
        for where in getattr(pkg, "__path__", ()):
            for name in sorted(os.listdir(where)):
                if os.path.isfile(os.path.join(where, name, PLUGIN_MODULE + ".py")):
                    out.append(name)
        return out

    def _load(self, folder: str) -> P:
        return importlib.import_module("{}.{}.{}".format(self._package, folder, PLUGIN_MODULE)).ENGINE

    def _discover(self) -> Dict[str, P]:
        if self._found is None:
            found: Dict[str, P] = {}
            for folder in self._folders():
                plugin = self._load(folder)
                found[plugin.name] = plugin
            self._found = found
        return self._found

    def _alone(self, name: str) -> Optional[P]:
        """The engine in the folder of that name, importing no other; None where the folder differs."""
        if name in self._one:
            return self._one[name]
        if self._folder_names is None:
            self._folder_names = self._folders()
        if name not in self._folder_names:
            return None
        plugin = self._load(name)
        if plugin.name != name:
            return None
        self._one[name] = plugin
        return plugin

    def register(self, plugin: P) -> P:
        """Add an engine defined outside the package's folders; replaces one of the same name."""
        self._extra[plugin.name] = plugin
        return plugin

    def unregister(self, name: str) -> None:
        self._extra.pop(name, None)

    def all(self) -> Tuple[P, ...]:
        merged = dict(self._discover())
        merged.update(self._extra)
        return tuple(merged[name] for name in sorted(merged))

    def names(self) -> Tuple[str, ...]:
        return tuple(p.name for p in self.all())

    def find(self, name: Any) -> Optional[P]:
        if not isinstance(name, str):
            return None
        found = self._extra.get(name)
        if found is None and self._found is None:
            found = self._alone(name)
        return found or self._discover().get(name)

    def get(self, name: str) -> P:
        plugin = self.find(name)
        if plugin is None:
            raise UnknownEngine(name)
        return plugin

    def first(self) -> P:
        return self.all()[0]

