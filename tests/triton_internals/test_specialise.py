"""The JIT's specialisation without a GPU (paged_mqa_logits/triton_internals/specialise.py):
recorded launches, stand-in arguments specialised like the tensors they stand for, and the
JIT's in-memory cache."""

import subprocess
import sys

import pytest
import torch

from kernels import scale_kernel
from paged_mqa_logits.triton_internals import specialise as sp
from paged_mqa_logits.triton_internals.compiler import CUDABackend, GPUTarget

SM_90 = GPUTarget("cuda", 90, 32)


def _record(*args, **kwargs):
    seen = []
    with sp.recording_jit_launches(SM_90, lambda kernel, spec: seen.append((kernel, spec))):
        assert scale_kernel[(1,)](*args, **kwargs) is None  # nothing compiled or launched
    return seen


def test_recording_hands_over_the_jits_specialisation_and_restores_the_jit():
    from triton.runtime.jit import JITFunction

    run = JITFunction.run
    src, dst = torch.zeros(64), torch.zeros(64)
    (kernel, spec), = _record(src, dst, 16, 16, 1, BLOCK=32)
    assert kernel is scale_kernel and JITFunction.run is run
    assert spec.signature == {"src": "*fp32", "dst": "*fp32", "n": "i32", "n_dynamic": "i32", "stride": "constexpr",
                              "BLOCK": "constexpr"}
    assert spec.options.num_warps == 4 and len(spec.jit_key) > 0
    (other, other_spec), = _record(src, dst, 17, 16, 1, BLOCK=32)
    assert other_spec.jit_key != spec.jit_key  # 17 is not 16-divisible: another specialisation


@pytest.mark.parametrize("n, n_dynamic, stride, offset", [(16, 16, 1, 0), (17, 32, 2, 1), (1, 1, 3, 4)])
def test_stand_ins_specialise_like_the_tensors_they_stand_for(n, n_dynamic, stride, offset):
    src, dst = torch.zeros(64)[offset:], torch.zeros(64)
    (_, recorded), = _record(src, dst, n, n_dynamic, stride, BLOCK=32)
    stand_ins = (sp.StandIn(torch.float32, 256, aligned=offset % 4 == 0), sp.StandIn(torch.float32, 256), n,
                 n_dynamic, stride)
    signature, consts, attrs = sp.specialise(scale_kernel, stand_ins, {"BLOCK": 32}, CUDABackend)
    assert signature == recorded.signature
    assert attrs == {path: attr for path, attr in recorded.attrs.items() if attr}  # the JIT also lists empty ones
    names = list(signature)
    assert {(names.index(k),): v for k, v in consts.items()} == recorded.constexprs
    assert (3,) not in attrs  # do_not_specialize: n_dynamic keeps its plain type


def test_specialise_wants_every_runtime_argument():
    assert sp.runtime_parameters(scale_kernel) == ["src", "dst", "n", "n_dynamic", "stride"]
    with pytest.raises(ValueError, match="takes 5 runtime arguments, got 2"):
        sp.specialise(scale_kernel, (1, 2), {"BLOCK": 32}, CUDABackend)


def test_fresh_jit_caches_start_empty_and_restore_what_was_there():
    marker = {"a key": "a kernel"}
    scale_kernel.device_caches[7] = (marker, {}, SM_90, None, None)
    try:
        assert sp.in_jit_cache(scale_kernel, 7, "a key") and not sp.in_jit_cache(scale_kernel, 7, "other")
        with sp.fresh_jit_caches([scale_kernel, scale_kernel]):
            assert sp.compiled_kernels(scale_kernel) == [] and not sp.in_jit_cache(scale_kernel, 7, "a key")
            scale_kernel.device_caches[8] = ({"new": "compiled meanwhile"}, {}, SM_90, None, None)
        assert sp.compiled_kernels(scale_kernel) == ["a kernel"] and 8 not in scale_kernel.device_caches
    finally:
        del scale_kernel.device_caches[7]


def test_a_kernels_cache_key_does_not_depend_on_what_was_keyed_before():
    """A precompiled cache is keyed in one order and looked up in another (an engine launches
    whatever it serves first): the sm_90 warp-specialised kernel's key is the same whether or
    not a kernel sharing its helpers was keyed first in the process."""
    probe = ("import sys\n"
             "from paged_mqa_logits.backends import registry\n"
             "registry.get('gluon')\n"
             "from paged_mqa_logits.backends.gluon.kernels import wgmma_ws, register_mma\n"
             "if sys.argv[1] == 'other first':\n"
             "    register_mma.register_mma_logits_kernel.cache_key\n"
             "print(wgmma_ws.wgmma_ws_logits_kernel.cache_key)\n")
    keys = {order: subprocess.run([sys.executable, "-c", probe, order], capture_output=True, text=True,
                                  check=True, timeout=300).stdout.strip() for order in ("alone", "other first")}
    assert keys["alone"] == keys["other first"], keys
