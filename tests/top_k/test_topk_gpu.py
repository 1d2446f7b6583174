"""The top-k op on a GPU (skipped without one): exact sets at k 512-2048, batches up to 4096,
contexts up to 160k, both layouts, the page-table transform, the engines' entry points and
CUDA-graph replay after the lengths change; ``triton_sample``'s list path and both fallbacks, and its
in-place stores against ``tl.store``'s."""

from __future__ import annotations

import pytest
import torch

from paged_mqa_logits import topk
from paged_mqa_logits.compat import vllm

from topk_cases import BACKENDS, KINDS, assert_exact, check_adversarial, lengths_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("with_table", [False, True])
def test_sample_in_place_stores_match_tl_store(monkeypatch, with_table):
    """The selection and the compaction's list stored from the registers that hold them (``triton_select.store``
    with ``IN_PLACE``, inline PTX, the default on NVIDIA GPUs) give, slot for slot, the selection ``tl.store`` does:
    rows held whole (8k and shorter, one at most ``k``) and rows listed and finished (32k), with and without the
    page table."""
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    assert triton_sample.in_place_for("cuda") and triton_sample.in_place_for("sm_90")
    g = torch.Generator().manual_seed(23)
    rows, width, k, block = 6, 32768, 2048, 64
    x = torch.randn(rows, width, generator=g)
    x[1, :4000] = 3.0  # ties at the threshold of a held row
    lengths = torch.tensor([8192, 5000, 2048, 1500, 32768, 20000], dtype=torch.int32)
    table = torch.randperm(rows * 512, generator=g).reshape(rows, 512).to(torch.int32) if with_table else None
    outs = []
    for in_place in (True, False):
        monkeypatch.setattr(triton_sample, "in_place_for", lambda arch, in_place=in_place: in_place)
        out = torch.full((rows, k), 7, dtype=torch.int32, device="cuda")
        triton_sample.launch(check_call(x.cuda(), lengths.cuda(), None, k, out,
                                        table.cuda() if with_table else None, block if with_table else 1), split=1)
        assert_exact(out, x, lengths, 1, k, table, block if with_table else 1)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


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


def _sampled_high_rows(rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    """Rows whose largest values (fewer than k 2048) sit at ``triton_sample``'s sample positions for
    ``n`` (> 2048): its seed lands too high and the row falls back."""
    x = torch.randn(rows, n, generator=g)
    piece = torch.arange(2048)
    x[:, ((piece // 128) * (n // 16) + piece % 128)[:1600]] = 10.0
    return x


@pytest.mark.parametrize("kind", ["random", "ascending", "descending", "constant", "sampled_high", "ties_at_top"])
@pytest.mark.parametrize("split", [1, 4])
def test_sample_paths_k2048(kind, split):
    """``triton_sample`` at k 2048 on its list path and both fallbacks (descending and sampled_high:
    the seed too high; constant and ties_at_top: the list overflows), one program a row and split."""
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    g = torch.Generator().manual_seed(21)
    rows, n, k = 4, 65536, 2048
    x = torch.randn(rows, n, generator=g)
    if kind in ("ascending", "descending"):
        x = torch.arange(n).float().repeat(rows, 1) * (1 if kind == "ascending" else -1)
    elif kind == "constant":
        x = torch.full((rows, n), 0.5)
    elif kind == "sampled_high":
        x = _sampled_high_rows(rows, n, g)
    elif kind == "ties_at_top":
        x[:, ::3] = 7.0
    lengths = torch.tensor([n, n - 1, 40000, 2100], dtype=torch.int32)
    table = torch.randperm(4 * 1024, generator=g)[: rows * 1024].reshape(rows, 1024).to(torch.int32)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    triton_sample.launch(check_call(x.cuda(), lengths.cuda(), None, k, out, table.cuda(), 64), split=split)
    assert_exact(out, x, lengths, 1, k, table, 64)


@pytest.mark.parametrize("batch, next_n, width, k", [
    (2, 1, 163840, 2048), (16, 2, 131072, 1024), (256, 1, 131072, 2048), (1024, 2, 8192, 512), (8, 1, 65536, 4096),
])
def test_sample_matches_torch(batch, next_n, width, k):
    """``triton_sample``'s own split rule and defaults against the torch backend (gathered values)."""
    g = torch.Generator().manual_seed(batch * 7 + width)
    logits = torch.randn(batch * next_n, width, generator=g).cuda()
    lengths = lengths_for(batch, next_n, width, False, g).cuda()
    out = topk(logits, lengths, k, next_n=next_n, backend="triton_sample")
    ref = topk(logits, lengths, k, next_n=next_n, backend="torch")
    values = logits.gather(1, out.long().clamp_min(0)).masked_fill(out < 0, 0).sort(1).values
    expected = logits.gather(1, ref.long().clamp_min(0)).masked_fill(ref < 0, 0).sort(1).values
    torch.testing.assert_close(values, expected, rtol=0, atol=0)
    assert torch.equal((out < 0).sum(1), (ref < 0).sum(1))
    assert_exact(out[:4], logits[:4], lengths[: max(1, 4 // next_n)], next_n, k)
