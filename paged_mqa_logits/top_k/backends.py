"""The top-k backends by name, and the default choice for a device.

The choice lives here, not in the logits op's tuned tables: ``torch`` on CPU tensors (the
interpreter runs the Triton kernels, exactly but slowly), ``triton`` (the portable kernel) on
every GPU until ``triton_radix`` (the histogram-first kernel) has been measured there.
``backend=`` on a call names one explicitly. Each backend's module is imported on first use, so
importing the package does not import Triton (as the logits backends' registry)."""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from .validate import TopkCall

#: backend name -> the module whose ``launch(call)`` writes ``call.out`` and nothing else
_MODULES = {"torch": "torch_ref", "triton": "triton_portable", "triton_radix": "triton_radix"}
BACKENDS = tuple(_MODULES)


def launcher(name: str) -> Callable[[TopkCall], None]:
    return importlib.import_module(f"{__package__}.{_MODULES[name]}").launch


def default_backend(device: torch.device) -> str:
    return "torch" if device.type == "cpu" else "triton"


def choose(device: torch.device, backend: str | None) -> str:
    """``backend`` when given (checked by the caller), else the device's default."""
    return backend if backend is not None else default_backend(device)
