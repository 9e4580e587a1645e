"""Packages whose public names load on first use (PEP 562), so that importing a package costs nothing until a
name is needed (``kvsim --help`` imports neither pandas nor plotly)."""
from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(namespace: dict, exports: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for the package whose globals are ``namespace``: ``exports`` maps each public
    name to the module defining it; the value is imported on first access and then kept in ``namespace``.

    Raises (from the returned function):
        AttributeError: for a name that is not exported.
    """
    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value
    return __getattr__
