"""MXFP4 queries and keys, and bf16 logits, through the op: the reference against an independent
float64 computation, every backend that runs on CPU (and on a GPU when one is present) against
the reference, bf16 as the fp32 logits rounded once, the argument rules, the problem key, and
the backends that decline them."""

import dataclasses
import math

import pytest
import torch

from op_cases import build, device_and_fp8, positional, random_case, reference_for, run_and_check
from paged_mqa_logits import PagedMQAArgumentError, paged_mqa_logits
from paged_mqa_logits.backends import get
from paged_mqa_logits.explain import describe_problem, explain
from paged_mqa_logits.problem import Problem
from paged_mqa_logits.reference import calc_diff, check_logits, make_inputs, reference_logits
from paged_mqa_logits.validate import build_launch_args

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1(nibble: int) -> float:
    return (-1.0 if nibble & 8 else 1.0) * E2M1[nibble & 7]


def naive_fp4_logits(inp) -> torch.Tensor:
    """Loop over rows and positions in float64, decoding nibbles and exponent bytes from the
    layout docs/CONTRACT.md states: ``sum_g 2^(eq_g + ek_g - 254) * dot_g(codes)`` per head."""
    q, q_scale, kv, w = inp["q_fp8"], inp["q_scale"], inp["kv_cache"], inp["weights"]
    lens, table, mml = inp["context_lens"], inp["kv_indices"], inp["max_model_len"]
    kv_block_size, pre = inp["kv_block_size"], inp["preshuffle"]
    batch, next_n, heads, half = q.shape
    flat = kv.as_strided((kv.shape[0] * kv.stride(0),), (1,), kv.storage_offset()).tolist()
    q_bytes, q_words = q.tolist(), q_scale.tolist()

    def codes(byte_list):
        return [_e2m1(b >> (4 * (i % 2)) & 0xF) for b in byte_list for i in (0, 1)]

    def exponents(word):
        return [(word >> (8 * g)) & 0xFF for g in range(4)]

    out = torch.full((batch * next_n, mml), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        for j in range(next_n):
            row_len = max(int(lens[b]) - next_n + j + 1, 0) if lens.dim() == 1 else max(int(lens[b, j]), 0)
            for p in range(min(row_len, mml, table.shape[1] * kv_block_size)):
                base, t = int(table[b, p // kv_block_size]) * kv.stride(0), p % kv_block_size
                if pre:
                    offs = [(t // 16) * 16 * half + (d // 16) * 256 + (t % 16) * 16 + d % 16 for d in range(half)]
                else:
                    offs = [t * half + d for d in range(half)]
                key = codes([flat[base + o] for o in offs])
                word = int.from_bytes(bytes(flat[base + kv_block_size * half + 4 * t: base + kv_block_size * half + 4 * t + 4]), "little")
                ek = exponents(word)
                total = 0.0
                for h in range(heads):
                    qv, eq = codes(q_bytes[b][j][h]), exponents(q_words[b][j][h])
                    score = sum(math.ldexp(sum(qv[i] * key[i] for i in range(32 * g, 32 * g + 32)),
                                           eq[g] + ek[g] - 254) for g in range(4))
                    total += max(score, 0.0) * float(w[b * next_n + j, h])
                out[b * next_n + j, p] = total
    return out


@pytest.mark.parametrize("kv_block_size,pre,lens_2d,next_n,pad", [(16, True, True, 3, 16), (1, False, False, 2, 0),
                                                       (32, False, True, 1, 68), (64, True, False, 4, 0)])
def test_fp4_reference_matches_an_independent_float64_computation(kv_block_size, pre, lens_2d, next_n, pad):
    inp = make_inputs(2, next_n, 16, [37, 70], kv_block_size=kv_block_size, preshuffle=pre, lens_2d=lens_2d, max_model_len=64,
                      block_stride_pad=pad, table_row_pad=2, seed=3, kv_format="fp4")
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           64, kv_block_size=kv_block_size, preshuffle=pre, q_scale=inp["q_scale"])
    naive = naive_fp4_logits(inp)
    assert torch.equal(torch.isfinite(ref), torch.isfinite(naive))
    valid = torch.isfinite(naive)
    assert calc_diff(ref[valid], naive[valid]) < 5e-6


# ----------------------------------------------------------------------------- every backend
FORMATS = [("fp4", torch.float32), ("fp4", torch.bfloat16), ("fp8", torch.bfloat16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kv_format,logits_dtype", FORMATS)
@pytest.mark.parametrize("seed", range(4))
def test_random_matrix(seed, kv_format, logits_dtype, backend, device):
    """Block sizes, preshuffle, 1-D/2-D and zero lengths, next_n 1..8, padded strides."""
    device, fp8 = device_and_fp8(device)
    case = random_case(900 + seed, heads=(16, 32, 64), max_context=160, max_batch=2)
    inp = build(dict(case, kv_format=kv_format, logits_dtype=logits_dtype), device=device, fp8_dtype=fp8)
    check = run_and_check(paged_mqa_logits, inp, backend=backend)
    assert check.untouched and check.calc_diff < 5e-6, f"{case}: {check.describe()}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kv_format", ["fp8", "fp4"])
@pytest.mark.parametrize("clean_logits", [False, True])
def test_bf16_logits_are_the_fp32_logits_rounded_once(kv_format, backend, clean_logits, device):
    device, fp8 = device_and_fp8(device)
    outs = {}
    for dtype in (torch.float32, torch.bfloat16):
        inp = make_inputs(3, 2, 32, [150, 0, 61], kv_block_size=16, preshuffle=True, max_model_len=170, seed=6,
                          kv_format=kv_format, logits_dtype=dtype, out_fill=-3.0, device=device, fp8_dtype=fp8)
        paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], backend=backend, clean_logits=clean_logits)
        outs[dtype] = inp["out_logits"]
    # -3.0 (untouched) and -inf (cleaned) are bf16 values too: every element is the fp32 one rounded
    assert torch.equal(outs[torch.bfloat16].view(torch.int16), outs[torch.float32].to(torch.bfloat16).view(torch.int16))
    assert (outs[torch.float32].to(torch.bfloat16) != outs[torch.float32]).any()  # the rounding did something


def test_the_triton_kernel_rounds_to_nearest_even_across_the_bf16_range():
    """Logits near ties, large and tiny, through the interpreter whose own fp32 -> bf16 cast
    truncates: every one the nearest bf16 (ties to even), as torch rounds."""
    inp = make_inputs(1, 1, 16, [64], kv_block_size=16, max_model_len=64, seed=2, kv_format="fp4",
                      logits_dtype=torch.bfloat16)
    fp32 = inp["out_logits"].float().clone()
    for scale in (1.0, 2.0 ** 100, 2.0 ** -100):
        inp["weights"].normal_().mul_(scale)
        paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], backend="triton")
        fp32.fill_(float("nan"))
        paged_mqa_logits(*positional(dict(inp, out_logits=fp32)), q_scale=inp["q_scale"], backend="triton")
        visible = fp32[:, :64]
        assert torch.equal(inp["out_logits"][:, :64].view(torch.int16), visible.to(torch.bfloat16).view(torch.int16))


# ----------------------------------------------------------------------------- problem key
def test_the_problem_key_carries_the_format_and_the_logits_dtype():
    inp = make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48, kv_format="fp4",
                      logits_dtype=torch.bfloat16, block_stride_pad=4)
    args = build_launch_args(*positional(inp), q_scale=inp["q_scale"])
    p = args.problem
    assert (p.shape_key.kv_format, p.shape_key.logits_dtype, p.token_bytes) == ("fp4", "bf16", 68)
    assert p.kv_block_stride == 16 * 68 + 4 and p.kv_stride_bytes == 16 * 68 + 4
    assert (p.shape_key.kv_format, p.shape_key.logits_dtype) == ("fp4", "bf16")
    assert args.q.dtype == torch.uint8 and args.q_scale is inp["q_scale"]
    packed = build_launch_args(*positional(dict(inp, kv_cache=make_inputs(
        2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48, kv_format="fp4")["kv_cache"])), q_scale=inp["q_scale"])
    assert packed.problem.kv_block_stride == 0  # packed fp4 blocks: the described default
    fp4x2 = build_launch_args(*positional(dict(inp, q_fp8=inp["q_fp8"].view(torch.float4_e2m1fn_x2))),
                              q_scale=inp["q_scale"])
    assert fp4x2.problem == p and fp4x2.q.dtype == torch.uint8  # torch's packed fp4 dtype is read as bytes
    record = dataclasses.asdict(p)
    key = {k: v for k, v in record.pop("shape_key").items() if k not in ("kv_format", "logits_dtype")}
    old_record = {**record, **key}  # flat, as problems were stored before they held their key
    assert Problem.from_record(old_record).shape_key.kv_format == "fp8"  # records written before the fields


def test_explain_takes_the_format_and_the_logits_dtype():
    common = dict(arch="sm_90", cu_num=132, batch=8, next_n=2, heads=64)
    assert describe_problem(**common, kv_format="fp4", logits_dtype="bf16").shape_key.logits_dtype == "bf16"
    for arch, cu in (("sm_90", 132), ("gfx950", 256), ("gfx942", 304)):
        # FlyDSL reads MXFP4 (gfx950: its scaled MFMA; gfx942: widened to fp8, at this shape)
        # on both CDNA chips; on sm_90 Gluon's wgmma_fp4 does (widened to fp8)
        fp4 = explain(**dict(common, arch=arch, cu_num=cu, heads=32), kv_format="fp4")  # no fp4 rows: the defaults
        assert fp4.backend == ("gluon" if arch == "sm_90" else "flydsl"), (arch, fp4.describe())
        assert (fp4.config.get("variant") == "wgmma_fp4") if arch == "sm_90" else \
            any(name == "gluon" for name, _ in fp4.skipped), (arch, fp4.describe())
        # Gluon writes bf16 logits: the table's fp32 row for the shape serves them
        bf16 = explain(**dict(common, arch=arch, cu_num=cu), logits_dtype="bf16")
        assert bf16.backend == "gluon" and "rows of fp32 logits" in bf16.describe(), (arch, bf16.describe())
    with pytest.raises(PagedMQAArgumentError, match=r"argument `kv_format`: expected one of fp8, fp4, got 'fp5'"):
        explain(**common, kv_format="fp5")
    with pytest.raises(PagedMQAArgumentError, match=r"argument `logits_dtype`: expected one of fp32, bf16, got 'f16'"):
        explain(**common, logits_dtype="f16")


#: why a backend declines MXFP4 on an arch (``None``: it serves it)
FP4_DECLINED = {("gluon", "sm_90"): None,  # the wgmma_fp4 variant
                ("gluon", "gfx950"): "gluon kernels read fp8 queries and keys, not fp4",
                ("gluon", "gfx942"): "gluon kernels read fp8 queries and keys, not fp4",
                ("flydsl", "gfx950"): None,
                ("flydsl", "gfx942"): None}


@pytest.mark.parametrize("name,arch", list(FP4_DECLINED))
def test_gluon_and_flydsl_decline_what_they_do_not_serve_explicitly(name, arch):
    backend = get(name)
    fp8 = describe_problem(arch=arch, cu_num=256, batch=8, next_n=1, heads=64)
    assert backend.unsupported(fp8) is None
    fp4 = dataclasses.replace(fp8, shape_key=dataclasses.replace(fp8.shape_key, kv_format="fp4"))
    bf16 = dataclasses.replace(fp8, shape_key=dataclasses.replace(fp8.shape_key, logits_dtype="bf16"))
    assert backend.unsupported(fp4) == FP4_DECLINED[name, arch]
    assert backend.unsupported(bf16) is None


# ----------------------------------------------------------------------------- argument rules
def fp4_base():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48, kv_format="fp4",
                       logits_dtype=torch.bfloat16)


def fp8_cache():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)["kv_cache"]


CASES = {
    "q_scale with an fp8 q": (lambda i: {"q_fp8": fp8_base_q()}, "q_fp8",
                              "dtype uint8 or float4_e2m1fn_x2", "float8_e4m3fn"),
    "packed q without q_scale": (lambda i: {"q_scale": None}, "q_scale", "int32 tensor of ue8m0 exponents", "None"),
    "q_scale type": (lambda i: {"q_scale": [1, 2]}, "q_scale", "a torch.Tensor", "list"),
    "q_scale dtype": (lambda i: {"q_scale": i["q_scale"].long()}, "q_scale", "dtype int32", "int64"),
    "q_scale rank": (lambda i: {"q_scale": i["q_scale"][0]}, "q_scale", "3-D tensor", "shape (2, 32)"),
    "q_scale shape": (lambda i: {"q_scale": i["q_scale"][:, :1]}, "q_scale", "shape [B=2, next_n=2, H=32]",
                      "shape (2, 1, 32)"),
    "q_scale strided": (lambda i: {"q_scale": torch.zeros(2, 32, 2, dtype=torch.int32).transpose(1, 2)}, "q_scale",
                        "contiguous last dimension", "stride 2"),
    "q_scale device": (lambda i: {"q_scale": i["q_scale"].to("meta")}, "q_scale", "a tensor on cpu", "meta"),
    "q packed width": (lambda i: {"q_fp8": torch.zeros(2, 2, 32, 128, dtype=torch.uint8)}, "q_fp8",
                       "packed bytes (dim 3) == 64", "128"),
    "fp8 cache with fp4 q": (lambda i: {"kv_cache": fp8_cache()}, "kv_cache",
                             "shape [num_blocks, KVBlockSize=16, 1, 68] (fp4: D / 2 + 4)", "132)"),
    "out dtype": (lambda i: {"out_logits": i["out_logits"].half()}, "out_logits", "dtype float32 or bfloat16",
                  "float16"),
}


def fp8_base_q():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)["q_fp8"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_invalid_fp4_and_bf16_arguments_raise_one_line_errors_and_write_nothing(name):
    change, argument, expected, got = CASES[name]
    inp = fp4_base()
    args = dict(zip(["q_fp8", "kv_cache", "weights", "out_logits", "context_lens", "kv_indices", "max_model_len",
                     "Preshuffle", "KVBlockSize"], positional(inp)), q_scale=inp["q_scale"])
    args.update(change(inp))
    out = args["out_logits"]
    before = out.clone()
    with pytest.raises(PagedMQAArgumentError) as err:
        paged_mqa_logits(**args)
    message = str(err.value)
    assert "\n" not in message and f"argument `{argument}`" in message, message
    assert expected in message and got in message, message
    assert torch.equal(out.view(torch.int16 if out.element_size() == 2 else torch.int32),
                       before.view(torch.int16 if out.element_size() == 2 else torch.int32))


def test_an_fp4_cache_with_an_fp8_q_names_the_cache():
    inp = make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)
    with pytest.raises(PagedMQAArgumentError, match=r"argument `kv_cache`: expected shape \[num_blocks, "
                                                    r"KVBlockSize=16, 1, 132\], got shape \(\d+, 16, 1, 68\)"):
        paged_mqa_logits(*positional(dict(inp, kv_cache=fp4_base()["kv_cache"])))


# ----------------------------------------------------------------------------- torch.compile
def test_torch_compile_fullgraph_with_mxfp4_and_bf16_equals_eager():
    inp = make_inputs(2, 2, 32, [90, 33], kv_block_size=16, max_model_len=96, seed=4, kv_format="fp4",
                      logits_dtype=torch.bfloat16)
    torch._dynamo.reset()

    def step(q, kv, w, out, lens, table, q_scale):
        paged_mqa_logits(q, kv, w, out, lens, table, 96, False, 16, q_scale=q_scale)
        return out

    args = [inp[k] for k in ("q_fp8", "kv_cache", "weights")]
    eager = step(*args, inp["out_logits"].clone(), inp["context_lens"], inp["kv_indices"], inp["q_scale"]).clone()
    got = torch.compile(step, fullgraph=True)(*args, inp["out_logits"].clone(), inp["context_lens"], inp["kv_indices"],
                                              inp["q_scale"])
    assert torch.equal(got.view(torch.int16), eager.view(torch.int16))
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kv_format,logits_dtype", FORMATS)
def test_graph_capture_and_replay_on_gpu(kv_format, logits_dtype):
    device, fp8 = device_and_fp8("cuda")
    inp = make_inputs(4, 2, 64, [900, 5, 64, 333], kv_block_size=64, device=device, seed=3, kv_format=kv_format,
                      logits_dtype=logits_dtype, fp8_dtype=fp8)

    def call():
        paged_mqa_logits(*positional(inp), q_scale=inp["q_scale"], context_hint=900)

    call()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    inp["out_logits"].fill_(float("nan"))
    before = inp["out_logits"].clone()
    graph.replay()
    torch.cuda.synchronize()
    check = check_logits(inp["out_logits"].cpu(), before.cpu(), reference_for(inp).cpu())
    assert check.untouched and check.calc_diff < 5e-6, check.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("kv_format,logits_dtype", FORMATS)
def test_output_and_cache_past_2gib_on_gpu(kv_format, logits_dtype):
    """Blocks padded to 1 MiB and a 4.2M-column output: cache and output offsets past 2^31 bytes."""
    device, fp8 = device_and_fp8("cuda")
    batch, next_n = 66, 2
    lens = [200 + 3 * b for b in range(batch)]
    lens[0] = 64 * 2100  # 2100+ blocks of 1 MiB
    inp = make_inputs(batch, next_n, 32, lens, kv_block_size=64, device=device, seed=8, kv_format=kv_format,
                      logits_dtype=logits_dtype, block_stride_pad=1 << 20, fp8_dtype=fp8)
    width = 4_200_000 * (2 if logits_dtype == torch.bfloat16 else 1)
    inp["out_logits"] = torch.full((batch * next_n + 1, width), float("nan"), dtype=logits_dtype, device=device)
    assert (batch * next_n - 1) * width * inp["out_logits"].element_size() > 2**31
    assert inp["kv_cache"].shape[0] * inp["kv_cache"].stride(0) > 2**31
    check = run_and_check(paged_mqa_logits, inp)
    assert check.untouched and check.calc_diff < 5e-6, check.describe()

