"""Small ``@triton.jit`` kernels the tests of the internals package launch."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_dynamic"])
def scale_kernel(src, dst, n, n_dynamic, stride, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK) * stride
    mask = offsets < n + n_dynamic * 0
    tl.store(dst + offsets, tl.load(src + offsets, mask=mask) * 2, mask=mask)


@triton.jit
def max_kernel(x, y, out, N: tl.constexpr):
    offsets = tl.arange(0, N)
    pairwise = tl.maximum(tl.load(x + offsets), tl.load(y + offsets))
    tl.store(out + offsets, pairwise)
    tl.store(out + N, tl.max(tl.load(x + offsets), 0))


@triton.jit
def sum_scan_kernel(x, out, N: tl.constexpr):
    values = tl.load(x + tl.arange(0, N))
    tl.store(out + tl.arange(0, N), tl.cumsum(values, axis=0) + tl.sum(values, axis=0))
