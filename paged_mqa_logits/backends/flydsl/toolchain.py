"""Whether the optional FlyDSL package is installed, asked without importing it (the backend
and the compile-only build both ask)."""

from __future__ import annotations

import importlib.util

NOT_INSTALLED = "flydsl is not installed (pip install paged_mqa_logits[rocm])"


def flydsl_installed() -> bool:
    """Whether ``import flydsl`` would find the package (without importing it)."""
    try:
        return importlib.util.find_spec("flydsl") is not None
    except (ImportError, ValueError):
        return False
