"""Interpreter twins (paged_mqa_logits/triton_internals/interpreter.py): a ``@triton.jit``
kernel runs on CPU tensors with the GPUs' float semantics, and Triton's language module is
left as it was for the GPU compiles of the same process."""

import math

import torch

from kernels import max_kernel
from paged_mqa_logits.triton_internals.interpreter import interpreted


def test_a_twin_runs_on_cpu_with_gpu_maxnum_and_leaves_triton_language_alone():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    members = {name: value for name, value in vars(tl).items()}
    x = torch.tensor([math.nan, 1.0, -3.0, 5.0])
    y = torch.tensor([2.0, math.nan, -4.0, 6.0])
    out = torch.full((5,), -1.0)
    twin = interpreted(max_kernel)
    assert interpreted(max_kernel) is twin
    twin[(1,)](x, y, out, N=4)
    assert out[:4].tolist() == [2.0, 1.0, -3.0, 6.0]  # IEEE maxNum: a NaN operand yields the other
    assert isinstance(tl.max, JITFunction) and vars(tl) == members


def test_a_gpu_compile_on_another_thread_waits_for_an_interpreted_launch(tmp_path):
    """The interpreter patches ``triton.language`` process-wide for a launch: an sm_90 compile
    started meanwhile on another thread must wait for it (it failed on interpreter objects)."""
    import threading
    import time

    from triton import knobs

    from paged_mqa_logits.triton_internals import device, interpreter
    from paged_mqa_logits.triton_internals.compiler import GPUTarget

    patched, released = threading.Event(), {}

    def cpu_call():
        with interpreter._interpreted_language():
            patched.set()
            time.sleep(0.5)
            released["at"] = time.monotonic()

    thread = threading.Thread(target=cpu_call)
    thread.start()
    patched.wait()
    try:
        with knobs.cache.scope():
            knobs.cache.dir = str(tmp_path)
            # max_kernel calls tl.max, a jitted helper the interpreter swaps for its twin
            with device.simulated_device(GPUTarget("cuda", 90, 32), [max_kernel]) as launches:
                max_kernel[(1,)](torch.ones(4), torch.ones(4), torch.zeros(5), N=4)
        compiled_at = time.monotonic()
    finally:
        thread.join()
    assert len(launches) == 1 and compiled_at >= released["at"]
