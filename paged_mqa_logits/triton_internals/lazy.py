"""Names resolved on first use, so that importing a module of this package does not import
Triton: a module lists a loader per name and installs :func:`module_getattr` as its
``__getattr__`` (PEP 562); a resolved value replaces the loader in the module's namespace."""

from __future__ import annotations

import importlib


def attribute(module: str, name: str):
    """A loader of ``module.name``."""
    return lambda: getattr(importlib.import_module(module), name)


def module_getattr(module_name: str, namespace: dict, loaders: dict):
    """The ``__getattr__`` of module ``module_name`` (whose globals are ``namespace``)."""

    def __getattr__(name: str):
        loader = loaders.get(name)
        if loader is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = namespace[name] = loader()  # resolved once
        return value

    return __getattr__
