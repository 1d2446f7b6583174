"""The MXFP4 codec (``paged_mqa_logits.fp4``, re-exported by ``reference``): e2m1 codes, their
packing, ue8m0 exponents and the quantiser, checked value by value against the format as
docs/CONTRACT.md states it."""

import pytest
import torch

from paged_mqa_logits.reference import (E2M1_VALUES, FP4_DTYPE, dequantize_fp4, e2m1_values, pack_e2m1, pack_kv_cache,
                                        quantize_e2m1, quantize_fp4, ue8m0_bytes, ue8m0_values, ue8m0_words,
                                        unpack_e2m1, unpack_kv_cache)


def test_e2m1_values_of_every_code():
    codes = torch.arange(16)
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] + [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert e2m1_values(codes).tolist() == expected
    assert E2M1_VALUES == tuple(expected[:8])


@pytest.mark.parametrize("x,code", [
    (0.24, 0), (0.25, 0), (0.26, 1), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (5.1, 7),
    (100.0, 7), (-0.1, 0), (-0.75, 10), (-6.0, 15), (-1e9, 15),
])
def test_quantize_e2m1_rounds_to_nearest_ties_to_even(x, code):
    assert quantize_e2m1(torch.tensor([x])).item() == code


def test_every_representable_value_quantises_to_itself():
    codes = torch.tensor([c for c in range(16) if c != 8], dtype=torch.uint8)  # -0 reads as 0
    assert torch.equal(quantize_e2m1(e2m1_values(codes)), codes)


def test_packing_puts_element_2i_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x8F]]
    assert torch.equal(unpack_e2m1(packed), codes)
    assert torch.equal(unpack_e2m1(packed.view(torch.float4_e2m1fn_x2)), codes)  # torch's packed fp4 dtype reads alike
    random = torch.randint(0, 16, (3, 5, 128), dtype=torch.uint8)
    assert torch.equal(unpack_e2m1(pack_e2m1(random)), random)


def test_exponent_words_hold_group_0_in_the_low_byte():
    exponents = torch.tensor([[1, 127, 128, 254]], dtype=torch.uint8)
    word = ue8m0_words(exponents)
    assert word.dtype == torch.int32 and word.tolist() == [1 | 127 << 8 | 128 << 16 | (254 << 24) - (1 << 32)]
    assert torch.equal(ue8m0_bytes(word), exponents)


def test_exponent_values_are_exact_powers_of_two():
    e = torch.arange(256, dtype=torch.int32)
    got = ue8m0_values(e)
    expected = torch.ldexp(torch.ones(256, dtype=torch.float64), (e - 127).double()).float()  # 2^128 -> inf
    assert torch.equal(got, expected)
    assert got[0].item() == 2.0 ** -127 and got[127].item() == 1.0 and got[255].item() == float("inf")


def test_dequantize_multiplies_each_32_element_group_by_its_exponent():
    codes = torch.randint(0, 16, (2, 128), dtype=torch.uint8)
    exponents = torch.tensor([[120, 127, 130, 140], [1, 254, 127, 100]], dtype=torch.uint8)
    got = dequantize_fp4(pack_e2m1(codes), ue8m0_words(exponents))
    group = torch.arange(128) // 32
    expected = e2m1_values(codes).double() * torch.exp2(exponents[:, group].double() - 127)
    assert torch.equal(got, expected.float())


def test_quantize_picks_the_smallest_power_of_two_that_fits_and_the_nearest_codes():
    x = torch.randn(4, 3, 128) * torch.tensor([1e-3, 1.0, 50.0])[None, :, None]
    x[0, 0, :32] = 0.0  # an all-zero group gets the smallest exponent a quantiser writes
    x[1, 1, 32:64] = 6.0  # amax / 6 = 1 exactly: 2^0, no larger
    packed, scale = quantize_fp4(x)
    assert packed.shape == (4, 3, 64) and packed.dtype == torch.uint8
    assert scale.shape == (4, 3) and scale.dtype == torch.int32
    exponents = ue8m0_bytes(scale).long()
    amax = x.unflatten(-1, (4, 32)).abs().amax(-1)
    factor = torch.exp2(exponents.double() - 127)
    nonzero = amax > 0
    assert (amax[nonzero] <= 6 * factor[nonzero]).all() and (amax[nonzero] > 3 * factor[nonzero]).all()
    assert exponents[0, 0, 0] == 1 and exponents[1, 1, 1] == 127
    back = dequantize_fp4(packed, scale).unflatten(-1, (4, 32))
    step = factor[..., None] * 2  # the widest gap between e2m1 values is 2 (4 -> 6)
    assert ((back - x.unflatten(-1, (4, 32))).abs() <= step / 2).all()
    again = dequantize_fp4(*quantize_fp4(back.flatten(-2)))
    assert torch.equal(again, back.flatten(-2))  # dequantised values quantise to themselves (their bytes may differ)


@pytest.mark.parametrize("preshuffle", [False, True])
def test_the_fp4_cache_layout_packs_and_unpacks(preshuffle):
    """Per block: the packed key bytes of its tokens (64 each), then one int32 exponent word per
    token; a padded block stride leaves the padding out."""
    packed, words = quantize_fp4(torch.randn(3, 16, 128))
    cache = pack_kv_cache(packed, words, preshuffle=preshuffle, block_stride=16 * 68 + 12)
    assert cache.shape == (3, 16, 1, 68) and cache.stride() == (16 * 68 + 12, 68, 68, 1)
    flat = cache.as_strided((3, 16 * 68 + 12), (16 * 68 + 12, 1))
    assert torch.equal(flat[:, 16 * 64:16 * 68].contiguous().view(torch.int32), words)
    if not preshuffle:
        assert torch.equal(flat[:, :16 * 64].reshape(3, 16, 64), packed)
    keys, scales = unpack_kv_cache(cache, kv_block_size=16, preshuffle=preshuffle, fp8_dtype=FP4_DTYPE)
    assert torch.equal(keys, packed) and torch.equal(scales, words)
