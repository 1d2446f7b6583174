"""The MXFP4 format of queries and keys: e2m1 codes packed two to a byte, one ue8m0 exponent per
32 elements (docs/CONTRACT.md, *MXFP4 inputs*). Plain torch, any device; the reference and the
input builders use it, tests check kernels against it.

* an e2m1 code is 4 bits: bit 3 the sign, bits 0-2 index the magnitudes
  ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` (:data:`E2M1_VALUES`);
* a byte holds elements ``2i`` (low nibble) and ``2i + 1`` (high nibble);
* a ue8m0 byte ``e`` stands for ``2^(e - 127)`` (in fp32: ``e = 0`` is the subnormal
  ``2^-127``, ``e = 255`` overflows to ``inf``); four of them, one per 32-element group, make one
  int32 word, the first group in the low byte;
* an element's value is its e2m1 value times its group's ``2^(e - 127)``.
"""

from __future__ import annotations

import torch

from .problem import FP4_GROUP

#: magnitudes of the e2m1 codes 0..7 (codes 8..15 are their negatives)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
UE8M0_BIAS = 127
#: exponents a quantiser writes: 0 and 255 are left out (their fp32 values are not normal)
UE8M0_RANGE = (1, 254)
#: where a magnitude rounds up to the next code, and whether a tie rounds up: ties go to the
#: even code, as IEEE round-to-nearest-even does
_BOUNDARIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of e2m1 ``codes`` (integers 0..15; a negative zero reads as 0)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    codes = codes.long()
    magnitude = table[codes & 7]
    return torch.where(codes & 8 != 0, -magnitude, magnitude)


def quantize_e2m1(x: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes nearest to ``x`` (ties to the even code; beyond 6 saturates to 6)."""
    magnitude = x.float().abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for boundary, tie_up in _BOUNDARIES:
        code += (magnitude >= boundary if tie_up else magnitude > boundary).to(torch.uint8)
    negative = (x < 0) & (code != 0)
    return code | (negative.to(torch.uint8) << 3)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` codes -> ``[..., D / 2]`` uint8 bytes, element ``2i`` in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: ``[..., D / 2]`` bytes -> ``[..., D]`` uint8 codes."""
    packed = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def ue8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """``[...]`` int32 words -> ``[..., 4]`` uint8 exponents, group 0 first."""
    return scale.contiguous().view(torch.uint8).reshape(*scale.shape, 4)


def ue8m0_words(exponents: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`ue8m0_bytes`: ``[..., 4]`` exponents -> ``[...]`` int32 words."""
    return exponents.to(torch.uint8).contiguous().view(torch.int32).squeeze(-1)


def ue8m0_values(exponents: torch.Tensor) -> torch.Tensor:
    """float32 ``2^(e - 127)`` of ue8m0 bytes, exact (built from the bits: ``e = 0`` is the
    subnormal ``2^-127``, ``e = 255`` is ``inf``)."""
    bits = (exponents.to(torch.int32) << 23).view(torch.float32)
    return torch.where(exponents == 0, torch.full_like(bits, 2.0 ** -UE8M0_BIAS), bits)


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``[..., D]`` values of packed codes ``[..., D / 2]`` and their int32 exponent
    words ``[...]`` (``D = 128``: four groups). Each value is an exact product, rounded once to
    fp32 where it falls outside fp32's normal range."""
    values = e2m1_values(unpack_e2m1(packed))
    groups = values.shape[-1] // FP4_GROUP
    factors = ue8m0_values(ue8m0_bytes(scale))[..., :groups]
    return (values.unflatten(-1, (groups, FP4_GROUP)) * factors[..., None]).flatten(-2)


def quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 quantisation of ``x [..., 128]``: ``(packed uint8 [..., 64], scale int32 [...])``.

    Each 32-element group gets the smallest power of two ``2^(e - 127)`` with ``amax / 2^(e - 127)
    <= 6`` (``e`` clamped to :data:`UE8M0_RANGE`), and each element the e2m1 code nearest to
    ``x / 2^(e - 127)``.
    """
    groups = x.shape[-1] // FP4_GROUP
    grouped = x.float().unflatten(-1, (groups, FP4_GROUP))
    amax = grouped.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    mantissa, exponent = torch.frexp(amax / E2M1_MAX)  # amax / 6 = mantissa * 2^exponent, mantissa in [0.5, 1)
    ceil_log2 = exponent - (mantissa == 0.5).to(exponent.dtype)
    biased = (ceil_log2 + UE8M0_BIAS).clamp(*UE8M0_RANGE)
    codes = quantize_e2m1(grouped / ue8m0_values(biased)[..., None])
    exponents = torch.zeros((*biased.shape[:-1], 4), dtype=torch.uint8, device=x.device)
    exponents[..., :groups] = biased.to(torch.uint8)
    return pack_e2m1(codes.flatten(-2)), ue8m0_words(exponents)
