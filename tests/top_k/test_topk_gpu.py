"""The top-k op on a GPU (skipped without one): exact sets at k 512-2048, batches up to 4096,
contexts up to 160k, both layouts, the page-table transform, the engines' entry points and
CUDA-graph replay after the lengths change."""

from __future__ import annotations

import pytest
import torch

from paged_mqa_logits import topk
from paged_mqa_logits.compat import vllm

from topk_cases import BACKENDS, KINDS, assert_exact, check_adversarial, lengths_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_adversarial_rows_k2048(backend, kind):
    check_adversarial(backend, kind, batch=4, next_n=2, width=20000, k=2048, device="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch, next_n, width, k, lens_2d", [
    (1, 1, 163840, 2048, False),
    (8, 4, 131072, 2048, True),
    (4096, 1, 8192, 2048, False),
    (1024, 2, 16384, 1024, True),
    (64, 8, 32768, 512, False),
])
def test_shapes(backend, batch, next_n, width, k, lens_2d):
    g = torch.Generator().manual_seed(batch + width)
    logits = torch.randn(batch * next_n, width, generator=g)
    lengths = lengths_for(batch, next_n, width, lens_2d, g)
    out = topk(logits.cuda(), lengths.cuda(), k, next_n=None if lens_2d else next_n, backend=backend)
    ref = topk(logits.cuda(), lengths.cuda(), k, next_n=None if lens_2d else next_n, backend="torch")
    if batch * next_n > 64:  # the host check is slow on thousands of rows: compare with the reference
        torch.testing.assert_close(logits.cuda().gather(1, out.long().clamp_min(0)).masked_fill(out < 0, 0).sort(1).values,
                                   logits.cuda().gather(1, ref.long().clamp_min(0)).masked_fill(ref < 0, 0).sort(1).values,
                                   rtol=0, atol=0)
        assert torch.equal((out < 0).sum(1), (ref < 0).sum(1))
        assert_exact(out[:8], logits[:8], lengths[: max(1, 8 // next_n)], next_n, k)
    else:
        assert_exact(out, logits, lengths, next_n, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_page_table_and_strides(backend):
    g = torch.Generator().manual_seed(7)
    batch, next_n, width, k, block = 4, 2, 8192, 2048, 64
    base = torch.randn(batch * next_n, width + 64, generator=g)
    logits = base[:, :width]
    lengths = lengths_for(batch, next_n, width, False, g)
    table = torch.randperm(4 * 128, generator=g)[: batch * 128].reshape(batch, 128).to(torch.int32)
    out = topk(base.cuda()[:, :width], lengths.cuda(), k, next_n=next_n, block_table=table.cuda(),
               block_size=block, backend=backend)
    assert_exact(out, logits, lengths, next_n, k, table, block)


def test_vllm_entry_point():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(6, 40000, generator=g)
    seq_lens = torch.tensor([40000, 100, 30000], dtype=torch.int32)
    indices = torch.empty(6, 2048, dtype=torch.int32, device="cuda")
    vllm.top_k_per_row_decode(logits.cuda(), 2, seq_lens.cuda(), indices, 6, 40000, 1, 2048)
    assert_exact(indices, logits, seq_lens, 2, 2048)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay_after_lengths_change(backend):
    g = torch.Generator().manual_seed(10)
    batch, next_n, width, k = 8, 2, 32768, 2048
    logits = torch.randn(batch * next_n, width, generator=g).cuda()
    lengths = torch.full((batch,), width, dtype=torch.int32, device="cuda")
    out = torch.empty(batch * next_n, k, dtype=torch.int32, device="cuda")
    topk(logits, lengths, k, next_n=next_n, out=out, backend=backend)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk(logits, lengths, k, next_n=next_n, out=out, backend=backend)
    for seed in range(3):
        new = lengths_for(batch, next_n, width, False, torch.Generator().manual_seed(seed))
        lengths.copy_(new)
        logits.copy_(torch.randn(batch * next_n, width, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert_exact(out, logits, new, next_n, k)
