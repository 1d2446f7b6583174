"""The Triton versions the package runs on and is tested with, checked when it is imported.

Policy: Triton is not a hard requirement of the distribution, because torch builds bring their
own under different names (CUDA builds ``triton``, ROCm builds ``pytorch-triton-rocm``) and pip
would install the CUDA ``triton`` wheel over a ROCm one; CPU builds of torch bring none (the
``triton`` extra installs it). Versions older than :data:`MINIMUM_TRITON` cannot run the kernels
(a Triton backend's first load fails with :class:`TritonMissing`, and the dispatch falls back
to torch; the package itself imports without Triton); newer than the newest tested one warn once.

Triton internals touched: ``triton._C.libtriton``'s binding type, read only once loaded
(:func:`nanobind_bindings_loaded`); otherwise ``triton.__version__`` and the installed distributions'
metadata. Verified on Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import warnings
from importlib import metadata

#: Triton minor versions the package is tested with, oldest and newest (CI runs both)
TESTED_TRITON = ((3, 6), (3, 9))
#: the oldest Triton the kernels run on (the ``triton`` extra's lower bound; no upper bound)
MINIMUM_TRITON = TESTED_TRITON[0]
#: distributions that install the ``triton`` package (upstream wheels; PyTorch's ROCm builds)
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")


class TritonMissing(ImportError):
    """No usable Triton in this environment (none installed, or older than the minimum)."""


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``3.9.0`` or ``3.6.0+git1234``."""
    match = re.match(r"\s*(\d+)\.(\d+)", text or "")
    if match is None:
        raise ValueError(f"not a Triton version: {text!r}")
    return int(match.group(1)), int(match.group(2))


def installed_version() -> str | None:
    """The Triton version of this environment, without importing Triton when it is not yet
    imported (``None`` when none is installed)."""
    module = sys.modules.get("triton")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    for dist in TRITON_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def version() -> tuple[int, int]:
    """``(major, minor)`` of the imported Triton (imports it)."""
    import triton

    return parse_version(triton.__version__)


def require_triton(text: str | None = None) -> None:
    """Raise :class:`TritonMissing` when this environment has no Triton module or one older
    than :data:`MINIMUM_TRITON` (``text``: the version to judge, default the installed one).
    Does not import Triton."""
    minimum = ".".join(map(str, MINIMUM_TRITON))
    how = (f"CUDA and ROCm builds of torch bring Triton; with a CPU build, pip install "
           f"'paged_mqa_logits[triton]' (or 'triton>={minimum}')")
    text = text if text is not None else installed_version()
    if text is None:
        try:
            found = importlib.util.find_spec("triton") is not None  # a source build without metadata
        except ImportError:  # an import hook that refuses it
            found = False
        if found:
            return
        raise TritonMissing(f"paged_mqa_logits needs Triton >= {minimum}, and this environment has none: {how}")
    try:
        old = parse_version(text) < MINIMUM_TRITON
    except ValueError:
        return  # an unparsable version gets the untested-version warning
    if old:
        raise TritonMissing(f"paged_mqa_logits needs Triton >= {minimum}, and this environment has Triton {text}: "
                            f"upgrade torch (it pins Triton) or Triton")


def tested_range_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_TRITON
    return f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}"


def is_tested(text: str) -> bool:
    return TESTED_TRITON[0] <= parse_version(text) <= TESTED_TRITON[1]


_WARNED_UNTESTED = False


def warn_if_untested(text: str | None = None) -> bool:
    """Warn (once per process) when the installed Triton is outside :data:`TESTED_TRITON`.
    Returns whether this call warned."""
    global _WARNED_UNTESTED
    if _WARNED_UNTESTED:
        return False
    text = text if text is not None else installed_version()
    if text is None:
        return False
    try:
        tested = is_tested(text)
    except ValueError:
        tested = False
    if tested:
        return False
    _WARNED_UNTESTED = True
    warnings.warn(f"paged_mqa_logits is tested with Triton {tested_range_text()}; this environment has Triton "
                  f"{text}: kernels may fail to compile or compile differently", RuntimeWarning, stacklevel=3)
    return True


def nanobind_bindings_loaded() -> bool:
    """Whether the loaded Triton's C++ bindings are nanobind's (Triton 3.9; 3.6 has pybind11), whose
    report of objects still alive at interpreter exit the test suite silences (tests/conftest.py).
    Reads ``triton._C.libtriton`` only if it is already imported."""
    libtriton = sys.modules.get("triton._C.libtriton")
    context = getattr(getattr(libtriton, "ir", None), "context", None)
    return libtriton is not None and type(context).__module__ == "nanobind"
