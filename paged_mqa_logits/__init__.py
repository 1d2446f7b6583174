"""FP8 paged MQA logits of the DeepSeek-V3.2 / GLM-5 sparse-attention indexer.

Public surface:

* :func:`paged_mqa_logits` — the op (drop-in signature of the upstream kernels), registered as
  ``torch.ops.paged_mqa_logits.paged_mqa_logits`` (torch.compile and graph capture ready).
* :func:`warmup` — compile every kernel a problem family can dispatch to, before graph capture.
* :func:`reload_tuned_table` — re-read the tuned tables after changing files or env vars.
* :func:`explain` — which backend, knobs and rule a problem would get.
* :func:`topk` — the exact top-k over logits rows that follows the op (docs/TOPK.md).
* :func:`indexer_topk` — the indexer step in one call: the logits, then their top-k (docs/TOPK.md).
* :mod:`paged_mqa_logits.reference` — the reference and input-building helpers.
* :mod:`paged_mqa_logits.compat` — DeepGEMM's and AITER's entry points on top of the op.

docs/CONTRACT.md is the contract every backend implements.
"""

# Triton is not needed to import: tables, ``explain`` and the torch backend work without it. A
# Triton backend checks for it when first loaded (backends/registry.py), so the dispatch falls back
# to torch and a forced Triton backend or a compile names what to install.
from .triton_internals.version import warn_if_untested
from .dispatch import reload_tuned_table
from .op import PagedMQAArgumentError
from .torch_op import paged_mqa_logits
from .aot.warmup import warmup
from .explain import explain
from .top_k import topk
from .indexer import indexer_topk

__all__ = ["paged_mqa_logits", "topk", "indexer_topk", "warmup", "reload_tuned_table", "explain",
           "PagedMQAArgumentError"]
__version__ = "0.1.0"

warn_if_untested()  # once per process, for a Triton outside the tested range (none: no warning)
