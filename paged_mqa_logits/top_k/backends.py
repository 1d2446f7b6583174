"""The top-k backends by name, and the default choice for a device.

The choice lives here, not in the logits op's tuned tables: ``torch`` on CPU tensors (the
interpreter runs the Triton kernels, exactly but slowly), ``triton`` (the portable kernel) on
every GPU until ``triton_radix`` (the histogram-first kernel) has been measured there.
``backend=`` on a call names one explicitly."""

from __future__ import annotations

from typing import Callable

import torch

from . import torch_ref, triton_portable, triton_radix
from .validate import TopkCall

#: backend name -> ``launch(call)``, which writes ``call.out`` and nothing else
BACKENDS: dict[str, Callable[[TopkCall], None]] = {
    "torch": torch_ref.launch,
    "triton": triton_portable.launch,
    "triton_radix": triton_radix.launch,
}


def default_backend(device: torch.device) -> str:
    return "torch" if device.type == "cpu" else "triton"


def choose(device: torch.device, backend: str | None) -> str:
    """``backend`` when given (checked by the caller), else the device's default."""
    return backend if backend is not None else default_backend(device)
