"""A thin caller shaped like vLLM's ROCm sparse-attention indexer decode step, checked end to end.

What it mirrors (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py, decode branch):

* the indexer K cache is ``[num_blocks, block_size, head_dim + 4]`` uint8 (fp8 keys in 16x16
  SHUFFLE tiles, then fp32 scales) and is passed as ``kv_cache.unsqueeze(-2)``;
* decode queries ``[num_decode_tokens, H, D]`` are reshaped to ``[B, next_n, H, D]``, weights
  are sliced to ``[:B * next_n]``;
* ``context_lens`` is the decode metadata's ``seq_lens``, 2-D ``[B, next_n]`` on the native
  multi-token path (padding rows hold 0);
* ``out_logits`` is a ``[B * next_n, max_model_len]`` fp32 slice of a workspace that is reused
  every step and never filled;
* the op is called positionally with exactly ``Preshuffle=True, KVBlockSize=64``;
* a top-k then reads only each row's valid range ``[0, seq_lens[b, j])`` (vLLM passes the 2-D
  lengths flattened with ``next_n=1``), indices past the range are -1.

The top-k indices are compared with the reference's; where logits tie (or nearly tie, on a GPU)
the selected logits' values are compared instead of the indices.
"""

import pytest
import torch

import paged_mqa_logits.torch_op as pml
from paged_mqa_logits.reference import make_inputs, reference_logits

HEADS, HEAD_DIM, BLOCK, TOPK = 64, 128, 64, 128


def indexer_decode_topk(q_fp8_tokens, indexer_k_cache, weights, seq_lens, block_table, workspace, max_model_len,
                        topk_tokens):
    """One decode step of the indexer, as the engine calls it. Returns ``[B * next_n, topk]`` int32."""
    batch, next_n = seq_lens.shape
    rows = batch * next_n
    kv_cache = indexer_k_cache.unsqueeze(-2)  # [num_blocks, block, 1, D + 4]
    q = q_fp8_tokens[:rows].reshape(batch, next_n, *q_fp8_tokens.shape[1:])
    logits = workspace[:rows, :max_model_len]
    pml.paged_mqa_logits(q, kv_cache, weights[:rows], logits, seq_lens, block_table, max_model_len,
                         Preshuffle=True, KVBlockSize=BLOCK)
    return top_k_per_row(logits, seq_lens.reshape(-1), topk_tokens)


def top_k_per_row(logits, row_ends, k):
    """Top-k of ``logits[r, :row_ends[r]]`` per row, -1 past the row's length; no host sync."""
    width = logits.shape[1]
    cols = torch.arange(width, device=logits.device)
    ends = row_ends.to(torch.int64).clamp(0, width)
    masked = torch.where(cols[None, :] < ends[:, None], logits, float("-inf"))  # never reads past the row
    _, idx = masked.topk(min(k, width), dim=1)
    slot = torch.arange(idx.shape[1], device=logits.device)
    return torch.where(slot[None, :] < ends.clamp_max(k)[:, None], idx, -1).to(torch.int32)


def assert_topk_matches(got, ref_logits, row_ends, k, *, rtol):
    """Same valid count and -1 padding per row; the same index set, or, where the sets differ
    (ties / near-ties at the cut), selected reference logits equal to the reference's top values."""
    expected = top_k_per_row(ref_logits, row_ends, k)
    assert torch.equal(got < 0, expected < 0), "valid/padding slots differ"
    for r in range(got.shape[0]):
        mine, theirs = got[r][got[r] >= 0].long(), expected[r][expected[r] >= 0].long()
        assert mine.unique().numel() == mine.numel(), f"row {r}: repeated index"
        assert all(0 <= i < int(row_ends[r]) for i in mine.tolist()), f"row {r}: index outside the valid range"
        if torch.equal(mine.sort().values, theirs.sort().values):
            continue
        got_vals = ref_logits[r, mine].sort(descending=True).values
        ref_vals = ref_logits[r, theirs].sort(descending=True).values
        torch.testing.assert_close(got_vals, ref_vals, rtol=rtol, atol=1e-5, msg=f"row {r}: different top-k values")


def _engine_state(device, fp8, steps_ahead):
    """Cache and metadata an engine holds: contexts grow by next_n per step; blocks are allocated
    for the last step up front (vLLM allocates ahead of decoding too)."""
    next_n = 2
    start = [900, 5, 0, 1500]  # sequence 2 is a padding slot (all its lengths 0)
    final = [0 if n == 0 else n + steps_ahead * next_n for n in start]
    inp = make_inputs(len(start), next_n, HEADS, final, kv_block_size=BLOCK, preshuffle=True, fp8_dtype=fp8,
                      lens_2d=True, max_model_len=2048, device=device, seed=7)
    indexer_k_cache = inp["kv_cache"].squeeze(2)  # the engine's 3-D cache tensor
    return inp, indexer_k_cache, start, next_n


def _run_steps(device, fp8, *, rtol, capture=False):
    """Three decode steps; with ``capture`` the step is captured once in a CUDA graph (as vLLM's
    FULL graph mode does) and replayed after each in-place metadata update."""
    steps = 3
    inp, indexer_k_cache, start, next_n = _engine_state(device, fp8, steps)
    batch, max_model_len = len(start), inp["max_model_len"]
    q_tokens = inp["q_fp8"].reshape(batch * next_n, HEADS, HEAD_DIM)
    workspace = torch.empty((batch * next_n + 6, max_model_len), dtype=torch.float32, device=device)
    workspace.fill_(float("nan"))  # stale garbage from earlier steps/layers; the op must not need it cleared
    seq_lens = torch.empty((batch, next_n), dtype=torch.int32, device=device)

    def step_fn():
        return indexer_decode_topk(q_tokens, indexer_k_cache, inp["weights"], seq_lens, inp["kv_indices"], workspace,
                                   max_model_len, TOPK)

    graph = None
    for step in range(steps):
        lengths = torch.tensor([0 if n == 0 else n + step * next_n for n in start], dtype=torch.int32, device=device)
        offsets = torch.arange(next_n, dtype=torch.int32, device=device) - (next_n - 1)
        seq_lens.copy_((lengths[:, None] + offsets[None, :]).clamp_min(0))  # updated in place, like metadata buffers
        if capture and graph is None:
            step_fn()  # eager warm-up: dispatch decided, kernels compiled
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_topk = step_fn()
        if graph is not None:
            graph.replay()
            got = static_topk.clone()
        else:
            got = step_fn()
        ref = reference_logits(inp["q_fp8"], indexer_k_cache.unsqueeze(-2), inp["weights"], seq_lens, inp["kv_indices"],
                               max_model_len, kv_block_size=BLOCK, preshuffle=True)
        assert_topk_matches(got.cpu(), ref.cpu(), seq_lens.reshape(-1).cpu(), TOPK, rtol=rtol)
        valid = torch.isfinite(ref)
        assert not torch.isnan(workspace[: batch * next_n][valid]).any(), "a valid logit was not written"
        assert torch.isnan(workspace[batch * next_n:]).all(), "rows past B*next_n were written"
    return got.cpu(), seq_lens.reshape(-1).cpu()


def test_vllm_style_decode_topk_on_cpu():
    got, row_lens = _run_steps("cpu", torch.float8_e4m3fn, rtol=0)
    assert row_lens.tolist() == [903, 904, 8, 9, 0, 0, 1503, 1504]  # last step: +4 tokens, 2-D layout
    assert (got >= 0).sum(dim=1).tolist() == [TOPK, TOPK, 8, 9, 0, 0, TOPK, TOPK]


def test_vllm_style_decode_topk_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm GPU; none present (CPU-only machine)")
    from paged_mqa_logits.arch import detect

    fp8 = torch.float8_e4m3fnuz if detect("cuda").arch == "gfx942" else torch.float8_e4m3fn
    # fp8 tensor-core accumulation carries ~1e-4 relative error (calc_diff ~1e-8, as DeepGEMM's):
    # near-ties at the top-k cut may swap, so the selected values agree to a few 1e-4.
    _run_steps("cuda", fp8, rtol=2e-3)
    _run_steps("cuda", fp8, rtol=2e-3, capture=True)
