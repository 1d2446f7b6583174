"""The indexer step on CPU (``paged_mqa_logits.indexer_topk``): the same logits as the logits op and
the exact top-k of them (checked against ``torch.topk``), both length layouts, next_n 1-4, the
visible width, the page-table transform, the errors naming the argument with nothing written, and
the registered op (traced by make_fx and torch.compile)."""

from __future__ import annotations

import pytest
import torch

import paged_mqa_logits
from paged_mqa_logits import PagedMQAArgumentError, indexer_topk, paged_mqa_logits as logits_op
from paged_mqa_logits.reference import make_inputs

from topk_cases import assert_exact

H, BLOCK, K = 16, 16, 16


def inputs(next_n: int, lens_2d: bool, lens=(70, 33, 9), **kwargs) -> dict:
    """Ragged sequences: one longer than k, one a little, one shorter than k (its rows see fewer than k)."""
    return make_inputs(len(lens), next_n, H, list(lens), kv_block_size=BLOCK, lens_2d=lens_2d, **kwargs)


def step(inp: dict, k: int = K, **kwargs):
    return indexer_topk(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                        inp["max_model_len"], k, KVBlockSize=inp["kv_block_size"], **kwargs)


def reference(inp: dict, rows: int) -> torch.Tensor:
    """The logits op alone, into a fresh buffer of the step's width."""
    out = torch.full((rows, inp["max_model_len"]), float("nan"))
    logits_op(inp["q_fp8"], inp["kv_cache"], inp["weights"], out, inp["context_lens"], inp["kv_indices"],
              inp["max_model_len"], KVBlockSize=inp["kv_block_size"])
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32).clone() if t.dtype == torch.float32 else t.clone()


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("lens_2d", [False, True])
def test_exact_against_the_logits_op_and_torch_topk(next_n, lens_2d):
    inp = inputs(next_n, lens_2d)
    rows = 3 * next_n
    out, logits = step(inp, return_logits=True)
    assert out.dtype == torch.int32 and out.shape == (rows, K) and logits.shape == (rows, inp["max_model_len"])
    ref = reference(inp, rows)
    seen = ~ref.isnan()
    assert torch.equal(logits[seen], ref[seen])  # the logits op's logits, bit for bit
    assert_exact(out, ref, inp["context_lens"], next_n, K)
    assert torch.equal(step(inp), out)  # allocated buffers, the same selection


def test_caller_buffers_written_where_the_ops_write_only():
    """``out_logits`` with spare rows and columns and a row stride past its width: only the visible
    positions of ``[:rows, :max_model_len]`` are written; ``out`` is written in place and returned."""
    inp = inputs(2, False)
    base = torch.full((8, inp["max_model_len"] + 24), float("nan"))
    base.view(torch.int32).fill_(0x7FBADBAD)
    out_logits = base[:, :-8]
    before = bits(base)
    out = torch.full((6, K), 99, dtype=torch.int32)
    result = step(inp, out_logits=out_logits, out=out)
    assert result is out and not bool((out == 99).any())
    changed = bits(base) != before
    ref = reference(inp, 6)
    expected = torch.zeros_like(changed)
    expected[:6, : inp["max_model_len"]] = ~ref.isnan()
    assert torch.equal(changed, expected)
    assert_exact(out, ref, inp["context_lens"], 2, K)


def test_selection_stays_within_the_block_tables_width():
    """A block table narrower than max_model_len: rows see (and select from) its width only."""
    inp = inputs(2, True, lens=(70, 40))
    table = inp["kv_indices"][:, :3].contiguous()  # 48 positions
    out, logits = indexer_topk(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], table,
                               inp["max_model_len"], K, KVBlockSize=BLOCK, return_logits=True)
    assert int(out.max()) < 48
    assert_exact(out, logits[:, :48], inp["context_lens"], 2, K)


def test_page_table_transform_and_topk_backend():
    inp = inputs(2, False)
    g = torch.Generator().manual_seed(3)
    table = torch.randperm(64, generator=g)[:15].reshape(3, 5).to(torch.int32)  # 80 positions a sequence
    out, logits = step(inp, block_table=table, block_size=BLOCK, return_logits=True, topk_backend="triton_radix")
    ref = reference(inp, 6)
    assert_exact(out, ref, inp["context_lens"], 2, K, table, BLOCK)
    plain = step(inp, topk_backend="torch")
    seq = torch.arange(6)[:, None] // 2
    mapped = torch.where(plain >= 0, table.long()[seq, plain.long().clamp_min(0) // BLOCK] * BLOCK + plain % BLOCK, -1)
    assert torch.equal(out.sort(dim=1).values, mapped.int().sort(dim=1).values)


def _bad(inp: dict, name: str):
    """A value of argument ``name`` that breaks its rule, and the fragment its error says."""
    rows = 6
    if name == "q_fp8":
        return inp["q_fp8"].float(), "dtype float8_e4m3fn"
    if name == "context_lens":
        return torch.ones(3, 3, dtype=torch.int32), "shape [B=3] or [B=3, next_n=2]"
    if name == "k":
        return 0, "an int in 1..4096"
    if name == "out":
        return torch.zeros(rows, K + 1, dtype=torch.int32), f"shape [rows={rows}, k={K}]"
    if name == "block_table":
        return torch.zeros(3, 2, dtype=torch.int32), "covering every column of `out_logits`"
    if name == "block_size":
        return 4, "1 without a `block_table`"
    if name == "topk_backend":
        return "cuda", "'torch', 'triton', 'triton_radix'"
    if name == "logits_backend":
        return "nope", "None or one of"
    raise ValueError(name)


@pytest.mark.parametrize("name", ["q_fp8", "context_lens", "k", "out", "block_table", "block_size", "topk_backend",
                                  "logits_backend"])
def test_errors_name_the_argument_and_write_nothing(name):
    inp = inputs(2, False)
    out_logits = torch.full((6, inp["max_model_len"]), 1.5)
    out = torch.full((6, K), 7, dtype=torch.int32)
    value, fragment = _bad(inp, name)
    call = dict(q_fp8=inp["q_fp8"], kv_cache=inp["kv_cache"], weights=inp["weights"],
                context_lens=inp["context_lens"], kv_indices=inp["kv_indices"], max_model_len=inp["max_model_len"],
                k=K, KVBlockSize=BLOCK, out_logits=out_logits, out=out)
    call[name] = value
    if name == "out":
        out = value
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{name}`") as error:
        indexer_topk(**call)
    assert fragment in str(error.value) and "got" in str(error.value)
    assert bool((out_logits == 1.5).all()) and bool((out == 7).all() if name != "out" else (out == 0).all())


@pytest.mark.parametrize("case", ["out_in_kv_indices", "out_in_out_logits", "table_in_out_logits"])
def test_aliasing_outputs_are_refused(case):
    inp = inputs(2, False)
    width = inp["max_model_len"]
    storage = torch.zeros(6 * width + 200, dtype=torch.int32)
    out_logits = torch.full((6, width), 1.5)
    out = torch.full((6, K), 7, dtype=torch.int32)
    table, kv_indices, what = None, inp["kv_indices"], None
    if case == "out_in_kv_indices":
        kv_indices = storage[: 3 * 10].view(3, 10)
        kv_indices[:, :5] = inp["kv_indices"]
        out, what = storage[: 6 * K].view(6, K), ("out", "kv_indices")
    elif case == "out_in_out_logits":
        out_logits = storage[: 6 * width].view(torch.float32).view(6, width)
        out, what = storage[:6 * K].view(6, K), ("out", "out_logits")
    else:
        out_logits = storage[: 6 * width].view(torch.float32).view(6, width)
        table, what = storage[:15].view(3, 5), ("out_logits", "block_table")
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{what[0]}`.*overlaps `{what[1]}`"):
        indexer_topk(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], kv_indices, width, K,
                     KVBlockSize=BLOCK, out_logits=out_logits, out=out, block_table=table,
                     block_size=BLOCK if table is not None else 1)


def test_registered_op_and_make_fx():
    from torch.fx.experimental.proxy_tensor import make_fx

    inp = inputs(2, True)
    out_logits = torch.full((6, inp["max_model_len"]), float("nan"))
    out = torch.empty(6, K, dtype=torch.int32)
    paged_mqa_logits.indexer.op(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                                inp["max_model_len"], K, out_logits, out, KVBlockSize=BLOCK)
    assert_exact(out, reference(inp, 6), inp["context_lens"], 2, K)

    def traced(q, kv, w, lens, table):
        return indexer_topk(q, kv, w, lens, table, inp["max_model_len"], K, KVBlockSize=BLOCK)

    tensors = (inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"])
    graph = make_fx(traced)(*tensors)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.paged_mqa_logits.indexer_topk.default in calls
    compiled = torch.compile(traced, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*tensors), traced(*tensors))
