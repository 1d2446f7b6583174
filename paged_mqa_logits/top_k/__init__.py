"""Exact top-k over logits rows: the indexer's selection after :func:`paged_mqa_logits`.

* :func:`topk` — the op (``torch.ops.paged_mqa_logits.topk``); docs/TOPK.md is its contract.
* :data:`BACKENDS` — ``torch`` (``torch.topk`` over the visible prefix), ``triton`` (a portable
  radix select) and ``triton_radix`` (histogram first, two reads of a row); both Triton kernels
  run on every Triton GPU and on CPU through the interpreter. Which one serves a call, with
  which knobs (``knobs.py``), is the tuned tables' choice (``backends.py``).
"""

from .backends import BACKENDS, default_backend
from .op import topk
from .validate import MAX_K

__all__ = ["topk", "BACKENDS", "default_backend", "MAX_K"]
