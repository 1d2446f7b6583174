"""Every validation error names the argument, the expectation and the given value, and leaves
``out_logits`` untouched."""

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import PagedMQAArgumentError, paged_mqa_logits
from paged_mqa_logits.reference import make_inputs


def base():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)


def call(inp, **overrides):
    args = dict(zip(["q_fp8", "kv_cache", "weights", "out_logits", "context_lens", "kv_indices", "max_model_len",
                     "Preshuffle", "KVBlockSize"], positional(inp)))
    kwargs = {k: overrides.pop(k) for k in ("context_hint", "clean_logits") if k in overrides}
    args.update(overrides)
    return paged_mqa_logits(*args.values(), **kwargs)


def strided_kv(inp):
    """Same shape, but the key/scale bytes of a block are not packed (token stride 264)."""
    kv = inp["kv_cache"]
    wide = torch.zeros(kv.shape[0] * kv.shape[1] * 264, dtype=torch.uint8)
    return wide.as_strided(kv.shape, (kv.shape[1] * 264, 264, 264, 1))


CASES = {
    "q dtype": (lambda i: {"q_fp8": i["q_fp8"].float()}, "q_fp8", "float8_e4m3fn or float8_e4m3fnuz", "float32"),
    "q rank": (lambda i: {"q_fp8": i["q_fp8"][0]}, "q_fp8", "4-D tensor", "shape (2, 32, 128)"),
    "q head_dim": (lambda i: {"q_fp8": i["q_fp8"][..., :64]}, "q_fp8", "head_dim (dim 3) == 128", "64"),
    "q next_n": (lambda i: {"q_fp8": torch.zeros(1, 9, 32, 128).to(torch.float8_e4m3fn)}, "q_fp8", "next_n (dim 1) in 1..8", "9"),
    "q heads": (lambda i: {"q_fp8": i["q_fp8"][:, :, :24]}, "q_fp8", "multiple of 16", "24"),
    "q strided": (lambda i: {"q_fp8": i["q_fp8"].transpose(2, 3).contiguous().transpose(2, 3)}, "q_fp8", "contiguous last dimension", "stride 32"),
    "q type": (lambda i: {"q_fp8": [1, 2]}, "q_fp8", "a torch.Tensor", "list"),
    "kv dtype": (lambda i: {"kv_cache": i["kv_cache"].view(torch.int8)}, "kv_cache", "dtype uint8", "int8"),
    "kv shape": (lambda i: {"kv_cache": i["kv_cache"][:, :8]}, "kv_cache", "shape [num_blocks, KVBlockSize=16, 1, 132]", "8, 1, 132)"),
    "kv last dim": (lambda i: {"kv_cache": i["kv_cache"][..., :128]}, "kv_cache", "shape [num_blocks, KVBlockSize=16, 1, 132]", "128)"),
    "kv layout": (lambda i: {"kv_cache": strided_kv(i)}, "kv_cache", "packed contiguously", "strides"),
    "block size": (lambda i: {"KVBlockSize": 8}, "KVBlockSize", "one of 1, 16, 32, 64, 128, 256", "8"),
    "block size vs cache": (lambda i: {"KVBlockSize": 32}, "kv_cache", "KVBlockSize=32", "16, 1, 132)"),
    "block size type": (lambda i: {"KVBlockSize": 16.0}, "KVBlockSize", "a Python int", "float"),
    "preshuffle type": (lambda i: {"Preshuffle": 1}, "Preshuffle", "a bool", "int"),
    "weights dtype": (lambda i: {"weights": i["weights"].half()}, "weights", "dtype float32", "float16"),
    "weights shape": (lambda i: {"weights": i["weights"][:3]}, "weights", "shape [B*next_n=4, H=32]", "(3, 32)"),
    "out dtype": (lambda i: {"out_logits": i["out_logits"].double()}, "out_logits", "dtype float32", "float64"),
    "out narrow": (lambda i: {"out_logits": i["out_logits"][:, :40]}, "out_logits", "at least max_model_len=48 columns", "40 columns"),
    "out rows": (lambda i: {"out_logits": i["out_logits"][:3]}, "out_logits", "at least B*next_n=4 rows", "3 rows"),
    "out strided": (lambda i: {"out_logits": i["out_logits"].t().contiguous().t()}, "out_logits", "contiguous last dimension", "stride"),
    "lens dtype": (lambda i: {"context_lens": i["context_lens"].long()}, "context_lens", "dtype int32", "int64"),
    "lens rank": (lambda i: {"context_lens": i["context_lens"][None]}, "context_lens", "1-D or 2-D", "shape (1, 2, 2)"),
    "lens length": (lambda i: {"context_lens": i["context_lens"][:1]}, "context_lens", "shape [B=2] or [B=2, next_n=2]", "(1, 2)"),
    "lens width": (lambda i: {"context_lens": i["context_lens"][:, :1]}, "context_lens", "[B=2, next_n=2]", "(2, 1)"),
    "table dtype": (lambda i: {"kv_indices": i["kv_indices"].long()}, "kv_indices", "dtype int32", "int64"),
    "table rows": (lambda i: {"kv_indices": i["kv_indices"][:1]}, "kv_indices", "2 rows", "(1, 3)"),
    "max_model_len type": (lambda i: {"max_model_len": 48.0}, "max_model_len", "a Python int", "float"),
    "max_model_len negative": (lambda i: {"max_model_len": -1}, "max_model_len", "an int in 0..2147483647", "-1"),
    "max_model_len past int32": (lambda i: {"max_model_len": 1 << 40}, "max_model_len", "an int in 0..2147483647", str(1 << 40)),
    "context_hint": (lambda i: {"context_hint": -5}, "context_hint", "an int >= 0", "-5"),
    "device": (lambda i: {"weights": i["weights"].to("meta")}, "weights", "a tensor on cpu", "meta"),
}


@pytest.mark.parametrize("name", CASES)
def test_validation_error(name):
    change, argument, expected, given = CASES[name]
    inp = base()
    out = inp["out_logits"]
    before = out.clone()
    overrides = change(inp)
    with pytest.raises(PagedMQAArgumentError) as err:
        call(inp, **overrides)
    message = str(err.value)
    assert f"`{argument}`" in message and expected in message and given in message, message
    assert torch.equal(before.view(torch.int32), out.view(torch.int32))
    target = overrides.get("out_logits")
    if isinstance(target, torch.Tensor) and target.device.type == "cpu":
        assert not torch.isfinite(target).any()  # make_inputs fills with NaN; nothing written


def test_preshuffle_needs_multiple_of_16():
    inp = make_inputs(1, 1, 32, [3], kv_block_size=1)
    with pytest.raises(PagedMQAArgumentError, match=r"`KVBlockSize`: expected a multiple of 16 when Preshuffle=True, got 1"):
        call(inp, Preshuffle=True)


def test_fp8_flavour_unsupported_on_arch(monkeypatch):
    """fnuz on an sm_90 device (arch override applies to GPU devices only, so fake the detection)."""
    from paged_mqa_logits import arch

    monkeypatch.setattr(arch, "detect", lambda device: arch.ArchInfo("sm_90", 132))
    inp = make_inputs(1, 1, 32, [3], kv_block_size=16, fp8_dtype=torch.float8_e4m3fnuz)
    with pytest.raises(PagedMQAArgumentError, match=r"`q_fp8`: expected the fp8 flavour native to sm_90 \(e4m3fn\), got float8_e4m3fnuz"):
        call(inp)
    monkeypatch.setattr(arch, "detect", lambda device: arch.ArchInfo("gfx942", 304))
    inp = make_inputs(1, 1, 32, [3], kv_block_size=16)
    with pytest.raises(PagedMQAArgumentError, match=r"native to gfx942 \(e4m3fnuz\), got float8_e4m3fn"):
        call(inp)


def test_misaligned_cache_offset():
    inp = base()
    kv = inp["kv_cache"]
    storage = torch.zeros(kv.shape[0] * kv.stride(0) + 2, dtype=torch.uint8)
    moved = storage.as_strided(kv.shape, kv.stride(), 2)
    with pytest.raises(PagedMQAArgumentError, match="`kv_cache`: expected a storage offset that is a multiple of 4 bytes .*, got 2"):
        call(inp, kv_cache=moved)


def test_block_stride_too_small():
    inp = base()
    kv = inp["kv_cache"]
    overlapping = kv.as_strided(kv.shape, (16 * 132 - 4, 132, 132, 1), kv.storage_offset())
    with pytest.raises(PagedMQAArgumentError, match=r"`kv_cache`: expected a block stride .* >= 2112 bytes, got 2108"):
        call(inp, kv_cache=overlapping)
