"""Drop-in entry points with the calling conventions of the kernels engines already call.

* :mod:`paged_mqa_logits.compat.deep_gemm`: ``get_paged_mqa_logits_metadata`` and
  ``fp8_paged_mqa_logits`` as in DeepGEMM (allocates and returns the logits);
* :mod:`paged_mqa_logits.compat.aiter`: ``deepgemm_fp8_paged_mqa_logits`` as in AITER
  (writes into a caller-provided ``out_logits``), and its ``top_k_per_row_decode``;
* :mod:`paged_mqa_logits.compat.vllm`: vLLM's ``top_k_per_row_decode`` (the selection after the logits).

They run the package's ops (validation, tuned-table dispatch, every backend), so an engine
switches with an import change; docs/CONTRACT.md is the contract they share.
"""
