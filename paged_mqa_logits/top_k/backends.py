"""The top-k backends by name, and which one (with which knobs) serves a call.

The choice is the tuned tables' (``paged_mqa_logits/table.py``: rows whose ``op`` is ``topk``,
keyed by arch, CU count, rows, ``k``, logits dtype and row width; :func:`table.lookup_topk`).
Without a row, the untuned default: ``torch`` on CPU tensors (the interpreter runs the Triton
kernels, exactly but slowly), ``triton_sample`` (one read of a row) on every GPU, with the knobs'
defaults (``knobs.py``: on a GPU they depend on whether the rows outnumber its SMs). ``backend=`` on a
call names one explicitly (with its default knobs).

:func:`choose` decides once per (chip, rows, ``k``, dtype, width) and caches the decision, as the
logits op's dispatcher does; a reloaded table (``reload_tuned_table``) is a new cache. Deciding
reads host ints only (shapes, the arch), so a call inside CUDA-graph capture never synchronises.
Each backend's module is imported on first use, so importing the package imports no Triton.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Callable

from .. import table
from ..arch import detect
from ..problem import TopkKey, logits_dtype_name
from ..triton_internals.version import installed_version
from .knobs import SPACES, default_config, many_rows
from .validate import TopkCall

#: backend name -> the module whose ``launch(call, knobs)`` writes ``call.out`` and nothing else
_MODULES = {"torch": "torch_ref", "triton": "triton_portable", "triton_radix": "triton_radix",
            "triton_sample": "triton_sample"}
BACKENDS = tuple(_MODULES)
assert BACKENDS == tuple(SPACES), "knobs.SPACES names every backend, in order"


def launcher(name: str) -> Callable[..., None]:
    return importlib.import_module(f"{__package__}.{_MODULES[name]}").launch


def default_backend(arch: str) -> str:
    """The untuned default: ``torch`` for CPU tensors, ``triton_sample`` on every GPU (on an H100 it ran
    1.3-5.9x faster than ``triton_radix`` at every shape of ``benchmarks/h100/topk_sample_vs_vllm.csv``, and
    it reads a row once where the portable ``triton`` reads it nine times; the AMD model of docs/TOPK.md ranks
    ``triton_sample`` above ``triton_radix`` too)."""
    return "torch" if arch == "cpu" else "triton_sample"


@dataclass(frozen=True)
class TopkChoice:
    backend: str
    config: dict
    rule: str  # which rule chose the backend
    source: str  # "path:line" of the table row, "defaults" or "backend="

    def describe(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(self.config.items())) or "none"
        return f"backend={self.backend} [{knobs}] rule: {self.rule} (from {self.source})"


def decide(arch: str, cu_num: int, key: TopkKey, context: int) -> TopkChoice:
    """The table's row for the call, else the default; not cached (:func:`choose` caches). A
    row naming a Triton backend where Triton is not installed falls back to ``torch``."""
    on_cpu = arch == "cpu"
    match = table.lookup_topk(arch, cu_num, key, context)
    if match.row is not None:
        row = match.row
        if row.backend == "torch" or installed_version() is not None:
            return TopkChoice(row.backend, {**default_config(row.backend, on_cpu, key.rows, cu_num), **row.knobs},
                              match.rule, row.source)
        return TopkChoice("torch", {}, f"fallback: table row {row.source} names {row.backend}, and Triton is not "
                                       "installed", "defaults")
    backend = default_backend(arch)
    if backend != "torch" and installed_version() is None:
        backend = "torch"
    knobs_rule = f"; its knobs for more rows ({key.rows}) than SMs ({cu_num})" \
        if many_rows(backend, on_cpu, key.rows, cu_num) else ""
    return TopkChoice(backend, default_config(backend, on_cpu, key.rows, cu_num),
                      f"default for {arch} ({match.rule}){knobs_rule}", "defaults")


_CACHE: dict[tuple, TopkChoice] = {}
_CACHE_TABLE: list = [None]  # the loaded table the cache was filled from
_LOCK = threading.Lock()


def choose(call: TopkCall, backend: str | None = None) -> TopkChoice:
    """Cached: the backend and knobs for a validated call (``backend`` given: that one)."""
    device = call.logits.device
    info = detect(device)
    if backend is not None:
        return TopkChoice(backend, default_config(backend, device.type == "cpu", call.rows, info.cu_num),
                          "backend= given", "backend=")
    key = TopkKey(rows=call.rows, k=call.k, logits_dtype=logits_dtype_name(call.logits.dtype))
    cache_key = (info.arch, info.cu_num, key, call.logits.shape[1])
    loaded = table.table()
    if _CACHE_TABLE[0] is not loaded:
        with _LOCK:
            if _CACHE_TABLE[0] is not loaded:
                _CACHE.clear()
                _CACHE_TABLE[0] = loaded
    choice = _CACHE.get(cache_key)
    if choice is None:
        choice = _CACHE.setdefault(cache_key, decide(*cache_key))
    return choice


def decisions() -> dict[tuple, TopkChoice]:
    """A copy of the cached decisions, by ``(arch, cu_num, TopkKey, width)``."""
    return dict(_CACHE)
