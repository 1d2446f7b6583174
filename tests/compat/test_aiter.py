"""The AITER drop-in, called the way vLLM's ROCm indexer decode step calls AITER: an
out-parameter ``[B * next_n, max_model_len]`` fp32 buffer, 2-D ``seq_lens``, explicit
``ChunkK=256, KVBlockSize=block_size, Preshuffle=..., WavePerEU=2``."""

import inspect

import pytest
import torch

from op_cases import device_and_fp8, positional
from paged_mqa_logits import backends, paged_mqa_logits
from paged_mqa_logits.compat import aiter
from paged_mqa_logits.dispatch import Choice
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits
from paged_mqa_logits.arch import native_fp8
from paged_mqa_logits.problem import Problem, ShapeKey, Target
from paged_mqa_logits.validate import PagedMQAArgumentError

HEADS = 64



def _inputs(device, fp8, *, next_n=2, kv_block_size=64, preshuffle=True, lens_2d=True, seed=0):
    return make_inputs(3, next_n, HEADS, [640, 3, 200], kv_block_size=kv_block_size, preshuffle=preshuffle,
                       lens_2d=lens_2d, max_model_len=768, fp8_dtype=fp8, device=device, seed=seed,
                       out_fill=float("-inf"))


def _reference(inp):
    return reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                            inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("preshuffle,kv_block_size,lens_2d", [(True, 64, True), (False, 64, True), (False, 1, False),
                                                              (True, 16, False)])
def test_vllm_rocm_decode_call_matches_reference(device, preshuffle, kv_block_size, lens_2d):
    device, fp8 = device_and_fp8(device)
    inp = _inputs(device, fp8, kv_block_size=kv_block_size, preshuffle=preshuffle, lens_2d=lens_2d)
    before = inp["out_logits"].clone()
    rows, width = 3 * 2, inp["max_model_len"]
    out = aiter.deepgemm_fp8_paged_mqa_logits(
        inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"][:rows, :width], inp["context_lens"],
        inp["kv_indices"], width, ChunkK=256, KVBlockSize=kv_block_size, Preshuffle=preshuffle, WavePerEU=2)
    assert out.data_ptr() == inp["out_logits"].data_ptr()
    assert check_logits(inp["out_logits"], before, _reference(inp)).ok


def test_defaults_equal_upstream_and_leave_the_pick_to_the_table(monkeypatch):
    params = inspect.signature(aiter.deepgemm_fp8_paged_mqa_logits).parameters
    assert [params[k].default for k in ("Preshuffle", "KVBlockSize", "ChunkK", "TotalCuCount", "WavePerEU",
                                        "VarCtxSchedule")] == [False, 1, 256, None, 2, None]
    seen = []
    torch_backend = backends.get("torch")
    monkeypatch.setattr(torch_backend, "launch", lambda args, config: seen.append(config))
    inp = _inputs("cpu", torch.float8_e4m3fn)
    aiter.deepgemm_fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                        inp["context_lens"], inp["kv_indices"], 768, True, 64)
    assert seen == [torch_backend.default_config(None)]


def test_explicit_knobs_reach_the_chosen_backend(monkeypatch):
    """ChunkK/WavePerEU/TotalCuCount given -> AITER's knob set on the backend dispatch picks,
    restricted to the knobs that backend reads (the portable Triton kernel: ChunkK, SplitKV)."""
    triton_backend = backends.get("triton")
    if triton_backend is None:
        pytest.skip(f"triton backend unavailable: {backends.load_error('triton')}")
    seen = []
    monkeypatch.setattr(triton_backend, "launch", lambda args, config: seen.append(config))
    monkeypatch.setattr(aiter.dispatch, "choose",
                        lambda problem, target=None: Choice("triton", {"num_warps": 4}, "test", "test"))
    inp = _inputs("cpu", torch.float8_e4m3fn, next_n=2)
    aiter.deepgemm_fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                        inp["context_lens"], inp["kv_indices"], 768, True, 64, ChunkK=128,
                                        TotalCuCount=80, WavePerEU=2)
    # AITER: SplitKV = ((max(1, 80 // 6) + 4) // 5 * 5) * 2 = 30
    assert seen == [{"num_warps": 4, "ChunkK": 128, "SplitKV": 30}]
    seen.clear()
    aiter.deepgemm_fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                        inp["context_lens"], inp["kv_indices"], 768, True, 64, ChunkK=256)
    assert seen[0]["ChunkK"] == 256  # an explicit value equal to the default is still explicit


def test_knob_mapping_is_aiters_formula():
    assert aiter.aiter_knobs(chunk_k=256, wave_per_eu=2, total_cu_count=304, batch=1, next_n=1) == {
        "ChunkK": 256, "WavePerEU": 2, "SplitKV": 610}
    assert aiter.aiter_knobs(chunk_k=64, wave_per_eu=4, total_cu_count=256, batch=128, next_n=2)["SplitKV"] == 20


@pytest.mark.parametrize("knobs,argument", [(dict(ChunkK=0), "ChunkK"), (dict(ChunkK=96), "ChunkK"),
                                            (dict(WavePerEU=0), "WavePerEU"), (dict(TotalCuCount=-3), "TotalCuCount"),
                                            (dict(VarCtxSchedule=[1]), "VarCtxSchedule")])
def test_bad_knobs_name_the_argument(knobs, argument):
    inp = _inputs("cpu", torch.float8_e4m3fn)
    before = inp["out_logits"].clone()
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{argument}`"):
        aiter.deepgemm_fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                            inp["context_lens"], inp["kv_indices"], 768, True, 64, **knobs)
    assert torch.equal(inp["out_logits"], before)


def _aiter_layout(kv_cache, fp8_typed: bool, padded: bool) -> torch.Tensor:
    """The cache as AITER's tests hand it over: the same bytes fp8-typed, and/or each
    KVBlockSize-1 token row padded to 144 bytes (the token's 132 bytes first)."""
    if padded:
        rows = torch.full((kv_cache.shape[0], 1, 1, 144), 0x7F, dtype=torch.uint8)  # padding bytes are fp8 NaN
        rows[..., :132] = kv_cache
        kv_cache = rows
    return kv_cache.view(torch.float8_e4m3fnuz) if fp8_typed else kv_cache


@pytest.mark.parametrize("backend", ["torch", "triton", None])
@pytest.mark.parametrize("fp8_typed,padded", [(True, False), (False, True), (True, True)])
def test_aiters_cache_layouts_give_the_same_logits(backend, fp8_typed, padded):
    inp = make_inputs(2, 2, 16, [40, 9], kv_block_size=1, lens_2d=True, max_model_len=48, out_fill=float("-inf"))
    expected = inp["out_logits"].clone()
    paged_mqa_logits(*positional(inp), backend=backend)
    got = torch.full_like(expected, float("-inf"))
    kv = _aiter_layout(inp["kv_cache"], fp8_typed, padded)
    args = list(positional(inp))
    args[1], args[3] = kv, got
    if backend is None:  # AITER's own entry point, explicit knobs as vLLM passes them
        aiter.deepgemm_fp8_paged_mqa_logits(*args[:7], Preshuffle=False, KVBlockSize=1, ChunkK=16, WavePerEU=2)
        paged_mqa_logits(*positional(inp))
    else:
        paged_mqa_logits(*args, backend=backend)
    assert torch.equal(got, inp["out_logits"])
    assert check_logits(got, torch.full_like(got, float("-inf")), _reference(inp)).ok


@pytest.mark.parametrize("kv_block_size,width", [(1, 136), (16, 144)])
def test_other_padded_widths_are_refused_naming_the_cache(kv_block_size, width):
    inp = _inputs("cpu", torch.float8_e4m3fn, kv_block_size=kv_block_size, preshuffle=False)
    args = list(positional(inp))
    args[1] = torch.zeros((4, kv_block_size, 1, width), dtype=torch.uint8)
    before = inp["out_logits"].clone()
    expected = "132 or 144" if kv_block_size == 1 else "132"
    with pytest.raises(PagedMQAArgumentError, match=rf"`kv_cache`: expected shape \[num_blocks, KVBlockSize="
                                                    rf"{kv_block_size}, 1, {expected}\], got shape"):
        paged_mqa_logits(*args)
    assert torch.equal(inp["out_logits"], before)


def test_aiters_split_count_past_our_bound_is_clamped_and_runs(monkeypatch):
    """WavePerEU=4 at B*next_n = 1 on 304 CUs: AITER's formula gives SplitKV 1220, past the
    kernels' 1024; the call runs with 1024 instead of failing on a knob the caller never named."""
    triton_backend = backends.get("triton")
    seen = []
    monkeypatch.setattr(triton_backend, "launch", lambda args, config: seen.append(config))
    monkeypatch.setattr(aiter.dispatch, "choose", lambda problem, target=None: Choice("triton", {}, "test", "test"))
    inp = make_inputs(1, 1, 16, [300], kv_block_size=16, max_model_len=320)
    aiter.deepgemm_fp8_paged_mqa_logits(*positional(inp)[:7], KVBlockSize=16, TotalCuCount=304, WavePerEU=4)
    assert aiter.aiter_knobs(chunk_k=256, wave_per_eu=4, total_cu_count=304, batch=1, next_n=1)["SplitKV"] == 1220
    assert seen == [{"ChunkK": 256, "SplitKV": 1024}]


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx950"])
@pytest.mark.parametrize("knobs", [dict(chunk_k=256, wave_per_eu=4, total_cu_count=304),
                                   dict(chunk_k=16, wave_per_eu=8, total_cu_count=256),
                                   dict(chunk_k=1024, wave_per_eu=1, total_cu_count=1)])
def test_explicit_knobs_give_a_config_every_backend_accepts(arch, knobs):
    """On every backend and Gluon variant that serves the problem, AITER's knob set (clamped, or
    left to the table where the kernels cannot combine it) passes the backend's own check."""
    target = Target.described(arch, 304)
    for kv_block_size, preshuffle in ((64, True), (1, False)):
        problem = Problem.of(ShapeKey(heads=64, head_dim=128, kv_block_size=kv_block_size, preshuffle=preshuffle,
                                      batch=1, next_n=1), target, max_model_len=4096, fp8=native_fp8(arch))
        upstream = aiter.aiter_knobs(batch=1, next_n=1, **knobs)
        for name in backends.names():
            if backends.why_not(name, problem, target) is not None:
                continue
            config = aiter.served_config(name, problem, backends.get(name).default_config(problem), upstream)
            assert backends.check_config(name, config, problem) is None, (name, config)
            assert config.get("SplitKV") in (None, 0) or config["SplitKV"] <= backends.MAX_SPLIT_KV
