"""The DeepGEMM drop-in, called the way vLLM's indexer decode step calls DeepGEMM on Hopper:
metadata from the 2-D ``seq_lens`` and the cache block size, then ``fp8_paged_mqa_logits``
with ``max_model_len`` and ``clean_logits=False``; the logits feed a per-row top-k that reads
only each row's visible range."""

import inspect

import pytest
import torch

from op_cases import device_and_fp8
from paged_mqa_logits.compat import deep_gemm
from paged_mqa_logits.reference import calc_diff, make_inputs, reference_logits, valid_mask
from paged_mqa_logits.validate import PagedMQAArgumentError

HEADS, BLOCK = 64, 64



def _vllm_decode_step(inp, num_sms, clean_logits=False):
    """vLLM: ``schedule_metadata`` is built once per step in the metadata builder (from the
    decode ``seq_lens`` and the cache block size); every indexer layer then passes its
    ``[num_blocks, block_size, D + 4]`` cache as ``.unsqueeze(-2)``, the decode queries reshaped
    to ``[B, next_n, H, D]``, sliced weights and ``max_model_len`` positionally."""
    seq_lens = inp["context_lens"]
    schedule_metadata = deep_gemm.get_paged_mqa_logits_metadata(seq_lens, BLOCK, num_sms)
    indexer_k_cache = inp["kv_cache"].squeeze(-2)  # the engine's own cache tensor
    batch, next_n = inp["q_fp8"].shape[:2]
    q_tokens = inp["q_fp8"].reshape(batch * next_n, *inp["q_fp8"].shape[2:])
    weights = torch.cat([inp["weights"], torch.zeros_like(inp["weights"][:3])])  # a larger buffer, sliced
    return deep_gemm.fp8_paged_mqa_logits(q_tokens.reshape(batch, next_n, *q_tokens.shape[1:]),
                                          indexer_k_cache.unsqueeze(-2), weights[:batch * next_n], seq_lens,
                                          inp["kv_indices"], schedule_metadata, inp["max_model_len"],
                                          clean_logits=clean_logits)


def _top_k_per_row(logits, valid, k):
    """The engine's next step: top-k over each row's visible range only; the selected values."""
    masked = torch.where(valid, logits, torch.tensor(float("-inf")))
    return masked.topk(k, dim=1).values


def _check(inp, logits, *, clean_logits):
    rows, width = inp["q_fp8"].shape[0] * inp["q_fp8"].shape[1], inp["max_model_len"]
    assert logits.shape == (rows, width) and logits.dtype == torch.float32
    assert logits.stride(1) == 1 and logits.stride(0) % deep_gemm.SPLIT_KV == 0 and logits.stride(0) >= width
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           width, kv_block_size=BLOCK)
    valid = valid_mask(inp["context_lens"], inp["q_fp8"].shape[1], width, inp["kv_indices"].shape[1] * BLOCK)
    assert calc_diff(logits[valid], ref[valid]) < 1e-3
    k = 16
    got, want = _top_k_per_row(logits.cpu(), valid.cpu(), k), _top_k_per_row(ref.cpu(), valid.cpu(), k)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    assert torch.allclose(got[finite], want[finite], rtol=1e-3, atol=1e-3)
    if clean_logits:
        assert torch.equal(logits == float("-inf"), ~valid)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("next_n,lens_2d,clean_logits", [(1, True, False), (2, True, False), (4, True, True),
                                                         (2, False, True)])
def test_vllm_decode_call_matches_reference(device, next_n, lens_2d, clean_logits):
    device, fp8 = device_and_fp8(device)
    inp = make_inputs(3, next_n, HEADS, [700, 5, 300], kv_block_size=BLOCK, lens_2d=lens_2d, max_model_len=1024,
                      fp8_dtype=fp8, device=device, seed=next_n)
    logits = _vllm_decode_step(inp, num_sms=132, clean_logits=clean_logits)
    _check(inp, logits, clean_logits=clean_logits)


def test_signatures_follow_deep_gemm():
    params = inspect.signature(deep_gemm.fp8_paged_mqa_logits).parameters
    assert list(params)[:8] == ["q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta",
                                "max_context_len", "clean_logits"]
    assert params["clean_logits"].default is False
    assert list(inspect.signature(deep_gemm.get_paged_mqa_logits_metadata).parameters)[:3] == [
        "context_lens", "block_kv", "num_sms"]


def _worker_starts(meta, lens):
    """Global segment index each worker starts at, decoded from (sequence, segment)."""
    segments = [-(-max(n, 0) // deep_gemm.SPLIT_KV) for n in lens]
    before = [sum(segments[:b]) for b in range(len(segments))]
    return [before[b] + s for b, s in meta[:-1].tolist()], sum(segments)


@pytest.mark.parametrize("lens,num_sms", [([700, 5, 300, 70000], 132), ([1, 1], 8), ([4096] * 7, 5), ([0, 256], 3)])
def test_metadata_splits_segments_evenly(lens, num_sms):
    context_lens = torch.tensor(lens, dtype=torch.int32)[:, None].repeat(1, 2)
    context_lens[:, 0] -= 1  # 2-D: the last column is the sequence's length
    meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens, BLOCK, num_sms)
    assert meta.shape == (num_sms + 1, 2) and meta.dtype == torch.int32
    assert meta[-1].tolist() == [len(lens), 0]
    starts, total = _worker_starts(meta, lens)
    per_worker = [b - a for a, b in zip(starts, starts[1:] + [total])]
    if total >= num_sms:
        assert starts[0] == 0 and max(per_worker) - min(per_worker) <= 1 and sum(per_worker) == total
        assert sorted(per_worker) == per_worker  # the first workers take the smaller share, as in DeepGEMM


def test_metadata_is_accepted_but_optional_for_the_result():
    inp = make_inputs(2, 2, HEADS, [300, 90], kv_block_size=BLOCK, max_model_len=512, seed=3)
    a = _vllm_decode_step(inp, num_sms=132)
    other = torch.zeros((9, 2), dtype=torch.int32)
    b = deep_gemm.fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"],
                                       inp["kv_indices"], other, 512)
    valid = valid_mask(inp["context_lens"], 2, 512, inp["kv_indices"].shape[1] * BLOCK)
    assert torch.equal(a[valid], b[valid])


@pytest.mark.parametrize("change,argument", [
    (dict(schedule_meta=torch.zeros(9, 3, dtype=torch.int32)), "schedule_meta"),
    (dict(schedule_meta=torch.zeros(9, 2, dtype=torch.int64)), "schedule_meta"),
    (dict(max_context_len=-1), "max_context_len"),
    (dict(max_context_len=1 << 40), "max_context_len"),  # checked before anything is allocated
    # every input is checked before the result is allocated (2^31 - 1 columns: 16 GiB)
    (dict(q=torch.zeros(2, 1, HEADS, 128, dtype=torch.float16), max_context_len=(1 << 31) - 1), "q"),
    (dict(indices=torch.zeros(2, dtype=torch.int64)), "indices"),
    (dict(indices=torch.zeros(3, dtype=torch.int32)), "indices"),
    (dict(block_table=torch.zeros(3, 8, dtype=torch.int32)), "block_table"),
])
def test_errors_name_deep_gemm_arguments(change, argument):
    inp = make_inputs(2, 1, HEADS, [100, 90], kv_block_size=BLOCK, max_model_len=256, seed=4)
    kwargs = dict(q=inp["q_fp8"], kv_cache=inp["kv_cache"], weights=inp["weights"], context_lens=inp["context_lens"],
                  block_table=inp["kv_indices"], schedule_meta=torch.zeros(9, 2, dtype=torch.int32),
                  max_context_len=256)
    kwargs.update(change)
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{argument}`"):
        deep_gemm.fp8_paged_mqa_logits(**kwargs)


@pytest.mark.parametrize("args,argument", [((torch.zeros(2, 2, dtype=torch.int64), 64, 8), "context_lens"),
                                           ((torch.zeros(2, 2, dtype=torch.int32), 48, 8), "block_kv"),
                                           ((torch.zeros(2, 2, dtype=torch.int32), 64, 0), "num_sms"),
                                           ((torch.zeros(2, 2, dtype=torch.int32), 64, 1 << 40), "num_sms")])
def test_metadata_errors(args, argument):
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{argument}`"):
        deep_gemm.get_paged_mqa_logits_metadata(*args)


# ----------------------------------------------------------------------------- fp8_fp4_paged_mqa_logits
def test_fp8_fp4_signature_follows_deep_gemm():
    params = inspect.signature(deep_gemm.fp8_fp4_paged_mqa_logits).parameters
    assert list(params) == ["q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta",
                            "max_context_len", "clean_logits", "logits_dtype", "indices"]
    assert params["clean_logits"].default is False and params["logits_dtype"].default is torch.float32
    assert params["indices"].default is None


@pytest.mark.parametrize("kv_format,logits_dtype,width,stride", [
    ("fp4", torch.float32, 600, 768), ("fp4", torch.bfloat16, 600, 1024), ("fp8", torch.bfloat16, 1024, 1024),
    ("fp8", torch.float32, 300, 512)])
@pytest.mark.parametrize("clean_logits", [False, True])
def test_mxfp4_and_bf16_calls_match_the_reference(kv_format, logits_dtype, width, stride, clean_logits):
    inp = make_inputs(3, 2, HEADS, [500, 5, 300], kv_block_size=BLOCK, max_model_len=width, seed=7,
                      kv_format=kv_format, logits_dtype=logits_dtype)
    meta = deep_gemm.get_paged_mqa_logits_metadata(inp["context_lens"], BLOCK, 132)
    q = (inp["q_fp8"].view(torch.float4_e2m1fn_x2), inp["q_scale"]) if kv_format == "fp4" else (inp["q_fp8"], None)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(q, inp["kv_cache"], inp["weights"], inp["context_lens"],
                                                inp["kv_indices"], meta, width, clean_logits, logits_dtype)
    assert logits.shape == (6, width) and logits.dtype == logits_dtype and logits.stride() == (stride, 1)
    assert logits.stride(0) * logits.element_size() % 1024 == 0  # DeepGEMM's row alignment
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           width, kv_block_size=BLOCK, q_scale=inp["q_scale"], logits_dtype=logits_dtype)
    valid = torch.isfinite(ref)
    assert calc_diff(logits[valid], ref[valid]) < 5e-6
    if clean_logits:
        assert torch.equal(logits == float("-inf"), ~valid)


def _varlen_inputs(kv_format="fp4"):
    """Two requests of 2 and 3 tokens (rows), each row its own length, the block-table rows of a
    request the same: DeepGEMM's varlen layout (``indices`` = the request of each row)."""
    inp = make_inputs(5, 1, HEADS, [705, 705, 302, 302, 302], kv_block_size=BLOCK, max_model_len=768, seed=2,
                      kv_format=kv_format)
    inp["context_lens"] = torch.tensor([[704], [705], [300], [301], [302]], dtype=torch.int32)
    table = inp["kv_indices"].clone()
    table[1], table[3], table[4] = table[0], table[2], table[2]
    inp["kv_indices"] = table
    return inp, torch.tensor([7, 7, 3, 3, 3], dtype=torch.int32)


@pytest.mark.parametrize("kv_format", ["fp8", "fp4"])
def test_varlen_rows_read_their_request_s_first_block_table_row(kv_format):
    inp, indices = _varlen_inputs(kv_format)
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           768, kv_block_size=BLOCK, q_scale=inp["q_scale"])
    junk = inp["kv_indices"].clone()
    junk[1], junk[3], junk[4] = -5, 10**6, 3  # rows after a request's first are never read
    meta = deep_gemm.get_paged_mqa_logits_metadata(inp["context_lens"], BLOCK, 132, indices=indices)
    q = (inp["q_fp8"], inp["q_scale"])
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(q, inp["kv_cache"], inp["weights"], inp["context_lens"], junk, meta,
                                                768, True, indices=indices)
    assert torch.equal(logits == float("-inf"), ~torch.isfinite(ref))  # each row its own length
    valid = torch.isfinite(ref)
    assert torch.equal(logits[valid], ref[valid])
    if kv_format == "fp8":
        legacy = deep_gemm.fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"],
                                                junk, meta, 768, True, indices=indices)
        assert torch.equal(legacy, logits)


@pytest.mark.parametrize("change,message", [
    (dict(indices=torch.zeros(4, dtype=torch.int32)), r"`indices`: expected a \[B=5\] int32 tensor .*got shape \(4,\)"),
    (dict(indices=torch.zeros(5, dtype=torch.int64)), r"`indices`: expected a \[B=5\] int32 tensor .*int64"),
    (dict(indices=[0, 0, 1, 1, 1]), r"`indices`: expected a \[B=5\] int32 tensor .*got list"),
    (dict(logits_dtype=torch.float16), r"`logits_dtype`: expected torch.float32 or torch.bfloat16, got torch.float16"),
    (dict(q="not a tensor"), r"`q`: expected a 4-D \[B, next_n, H, D\] fp8 tensor or a \(q_fp4"),
    (dict(q_sf=lambda inp: inp["q_scale"].long()), r"`q`: expected dtype int32, got int64"),
])
def test_fp8_fp4_errors_name_deep_gemm_arguments(change, message):
    inp, indices = _varlen_inputs()
    kwargs = dict(q=(inp["q_fp8"], inp["q_scale"]), kv_cache=inp["kv_cache"], weights=inp["weights"],
                  context_lens=inp["context_lens"], block_table=inp["kv_indices"],
                  schedule_meta=torch.zeros(9, 2, dtype=torch.int32), max_context_len=768, indices=indices)
    q_sf = change.pop("q_sf", None)
    if q_sf is not None:
        kwargs["q"] = (inp["q_fp8"], q_sf(inp))
    kwargs.update(change)
    with pytest.raises(PagedMQAArgumentError, match=message):
        deep_gemm.fp8_fp4_paged_mqa_logits(**kwargs)


def test_varlen_needs_next_n_1_and_the_legacy_name_needs_an_fp8_tensor():
    inp = make_inputs(2, 2, HEADS, [100, 90], kv_block_size=BLOCK, max_model_len=256, seed=4)
    meta = torch.zeros(9, 2, dtype=torch.int32)
    with pytest.raises(PagedMQAArgumentError, match=r"`indices`: expected None when next_n > 1 .*got next_n 2"):
        deep_gemm.fp8_fp4_paged_mqa_logits((inp["q_fp8"], None), inp["kv_cache"], inp["weights"], inp["context_lens"],
                                           inp["kv_indices"], meta, 256, indices=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(PagedMQAArgumentError, match=r"`indices`: expected None when next_n > 1"):
        deep_gemm.get_paged_mqa_logits_metadata(inp["context_lens"], BLOCK, 8, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(PagedMQAArgumentError, match=r"`q`: expected an fp8 tensor \(fp4 goes through "):
        deep_gemm.fp8_paged_mqa_logits((inp["q_fp8"], None), inp["kv_cache"], inp["weights"], inp["context_lens"],
                                       inp["kv_indices"], meta, 256)
