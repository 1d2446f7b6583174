"""The indexer step on a GPU (skipped without one): captured in a CUDA graph and replayed after the
lengths (and the queries) change in place, each replay's selection exact over the logits the logits
op computes for the new lengths, both length layouts, with and without the page-table transform."""

from __future__ import annotations

import pytest
import torch

from paged_mqa_logits import indexer_topk, paged_mqa_logits as logits_op
from paged_mqa_logits.arch import detect, native_fp8_dtype
from paged_mqa_logits.reference import make_inputs

from topk_cases import assert_exact

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("lens_2d", [False, True])
@pytest.mark.parametrize("with_table", [False, True])
def test_graph_replay_after_lengths_change(lens_2d, with_table):
    batch, next_n, heads, context, block, k = 8, 2, 64, 8192, 64, 2048
    inp = make_inputs(batch, next_n, heads, context, kv_block_size=block, lens_2d=lens_2d, device="cuda",
                      fp8_dtype=native_fp8_dtype(detect(torch.device("cuda")).arch))
    rows = batch * next_n
    lens, q = inp["context_lens"], inp["q_fp8"]
    out_logits = torch.empty(rows, context, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    table = inp["kv_indices"] if with_table else None

    def step():
        indexer_topk(q, inp["kv_cache"], inp["weights"], lens, inp["kv_indices"], context, k, KVBlockSize=block,
                     out_logits=out_logits, out=out, block_table=table, block_size=block if with_table else 1,
                     context_hint=context)

    step()  # compiles every kernel outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    g = torch.Generator().manual_seed(1)
    for seed in range(3):
        seq = torch.randint(1, context + 1, (batch,), generator=g, dtype=torch.int32)
        seq[0] = seed  # an empty sequence (and the first replay's rows shorter than next_n)
        new = seq
        if lens_2d:
            j = torch.arange(next_n, dtype=torch.int32)
            new = (seq[:, None] - next_n + 1 + j[None, :]).clamp_min(0).to(torch.int32)
        lens.copy_(new)
        q.copy_((torch.randn(q.shape, generator=g) * 8).to(q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.full((rows, context), float("nan"), device="cuda")
        logits_op(q, inp["kv_cache"], inp["weights"], ref, lens, inp["kv_indices"], context, KVBlockSize=block,
                  context_hint=context)
        seen = ~ref.isnan()
        assert torch.equal(out_logits[seen], ref[seen])  # the replay's logits are the op's for the new lengths
        assert_exact(out, ref.nan_to_num(0.0), new, next_n, k, table, block)
