"""FP8 paged MQA logits of the DeepSeek-V3.2 / GLM-5 sparse-attention indexer.

Public surface:

* :func:`paged_mqa_logits` — the op (drop-in signature of the upstream kernels).
* :func:`reload_tuned_table` — re-read the tuned tables after changing files or env vars.
* :func:`explain` — which backend, knobs and rule a problem would get.
* :mod:`paged_mqa_logits.reference` — the reference and input-building helpers.
"""

from .dispatch import reload_tuned_table
from .op import PagedMQAArgumentError, paged_mqa_logits
from .explain import explain

__all__ = ["paged_mqa_logits", "reload_tuned_table", "explain", "PagedMQAArgumentError"]
__version__ = "0.1.0"
