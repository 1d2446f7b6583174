"""The randomised correctness matrix shared by the CPU op tests and the GPU backend tests, and
the device choice of tests parametrised over CPU and GPU."""

import random

import pytest
import torch

from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits

KV_BLOCK_SIZES = (1, 16, 32, 64, 128, 256)


def random_case(seed: int, *, heads=(16, 32, 64), kv_block_sizes=KV_BLOCK_SIZES, max_context=300, max_batch=3):
    """A random problem: block size, preshuffle, 1-D/2-D lengths, odd and zero contexts,
    next_n 1..8, wide outputs, padded block strides, strided tables and output rows."""
    rng = random.Random(seed)
    kv_block_size = rng.choice(kv_block_sizes)
    pre = kv_block_size % 16 == 0 and rng.random() < 0.5
    next_n = rng.choice((1, 2, 3, 4, 8))
    batch = rng.randint(1, max_batch)
    lens = [rng.choice((0, 1, rng.randint(1, max_context), rng.randint(1, max_context) | 1)) for _ in range(batch)]
    lens[0] = max(lens[0], next_n)  # at least one non-trivial row
    mml = max(lens) + rng.choice((0, 5, 64)) if rng.random() < 0.8 else max(1, max(lens) // 2)
    return dict(
        batch=batch, next_n=next_n, heads=rng.choice(heads), context_lens=lens, kv_block_size=kv_block_size, preshuffle=pre,
        lens_2d=rng.random() < 0.6, max_model_len=mml, block_stride_pad=rng.choice((0, 16, 132)),
        table_pad=rng.choice((0, 2)), table_row_pad=rng.choice((0, 3)), out_row_pad=rng.choice((0, 2)), seed=seed,
    )


def build(case: dict, device="cpu", fp8_dtype=torch.float8_e4m3fn):
    case = dict(case)
    batch, next_n, heads, lens = case.pop("batch"), case.pop("next_n"), case.pop("heads"), case.pop("context_lens")
    return make_inputs(batch, next_n, heads, lens, device=device, fp8_dtype=fp8_dtype, **case)


def positional(inp: dict) -> tuple:
    return (inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"], inp["kv_indices"],
            inp["max_model_len"], inp["preshuffle"], inp["kv_block_size"])


def reference_for(inp: dict) -> torch.Tensor:
    """The reference of ``inp``, in its format and logits dtype."""
    return reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                            inp["max_model_len"], kv_block_size=inp["kv_block_size"], preshuffle=inp["preshuffle"],
                            q_scale=inp["q_scale"], logits_dtype=inp["out_logits"].dtype)


def run_and_check(op, inp: dict, **kwargs):
    """Call ``op`` on ``inp`` (its ``q_scale`` too, for MXFP4 inputs) and compare with the
    reference; returns the Check."""
    before = inp["out_logits"].clone()
    if inp["q_scale"] is not None:
        kwargs = dict(kwargs, q_scale=inp["q_scale"])
    result = op(*positional(inp), **kwargs)
    assert result is inp["out_logits"]
    ref = reference_for(inp)
    return check_logits(inp["out_logits"].cpu(), before.cpu(), ref.cpu(), clean_logits=kwargs.get("clean_logits", False))


def device_and_fp8(device: str):
    """``(device, the device's native fp8 dtype)`` for a test parametrised over ``cpu``/``cuda``;
    skips (saying why) when ``cuda`` is asked for on a machine without a GPU."""
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA/ROCm GPU; none present (CPU-only machine)")
        from paged_mqa_logits.arch import detect

        return "cuda", torch.float8_e4m3fnuz if detect("cuda").arch == "gfx942" else torch.float8_e4m3fn
    return "cpu", torch.float8_e4m3fn
