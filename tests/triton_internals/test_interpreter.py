"""Interpreter twins (paged_mqa_logits/triton_internals/interpreter.py): a ``@triton.jit``
kernel runs on CPU tensors with the GPUs' float semantics, and Triton's language module is
left as it was for the GPU compiles of the same process."""

import math

import torch

from kernels import max_kernel, sum_scan_kernel
from paged_mqa_logits.triton_internals.interpreter import interpreted


def test_a_twin_runs_on_cpu_with_gpu_maxnum_and_leaves_triton_language_alone():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    # a submodule the launch imports for the first time (``triton.language.semantic``) becomes an
    # attribute of the package by the import system, not by a patch
    members = {name: value for name, value in vars(tl).items()}

    def unpatched():
        return {name: value for name, value in vars(tl).items()
                if not (name not in members and isinstance(value, type(tl)))}

    x = torch.tensor([math.nan, 1.0, -3.0, 5.0])
    y = torch.tensor([2.0, math.nan, -4.0, 6.0])
    out = torch.full((5,), -1.0)
    twin = interpreted(max_kernel)
    assert interpreted(max_kernel) is twin
    twin[(1,)](x, y, out, N=4)
    assert out[:4].tolist() == [2.0, 1.0, -3.0, 6.0]  # IEEE maxNum: a NaN operand yields the other
    assert isinstance(tl.max, JITFunction) and unpatched() == members


def test_sums_and_scans_take_numpys_path_and_the_combine_function_is_restored(monkeypatch):
    """``tl.sum``/``tl.cumsum`` reach the interpreter with the interpreted twin of ``_sum_combine``;
    it must stand in for ``tl.standard``'s during a launch, or every sum runs element by element."""
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    original = tl.standard._sum_combine
    generic = []
    monkeypatch.setattr(interpreter.ReduceOps, "generic_reduce", lambda self, input: generic.append(1))
    monkeypatch.setattr(interpreter.ScanOps, "generic_scan", lambda self, input: generic.append(1))
    x = torch.arange(8, dtype=torch.int32)
    out = torch.zeros(8, dtype=torch.int32)
    interpreted(sum_scan_kernel)[(1,)](x, out, N=8)
    assert out.tolist() == (torch.cumsum(x, 0) + 28).tolist()
    assert not generic  # neither the sum nor the scan took the element-by-element path
    assert tl.standard._sum_combine is original


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


def test_a_direct_sm90_compile_on_another_thread_succeeds_while_cpu_calls_run_interpreted(tmp_path):
    """CPU calls of the op (the triton backend, interpreted) on one thread; on another, sm_90
    cross-compiles through ``triton.compile`` itself, which holds no lock of the package's: each
    compile must see the real ``triton.language`` (it failed on interpreter objects, every time)."""
    import threading

    import triton
    from triton import knobs

    from paged_mqa_logits import backends
    from paged_mqa_logits.op import launch
    from paged_mqa_logits.reference import make_inputs
    from paged_mqa_logits.triton_internals.compiler import ASTSource, GPUTarget
    from paged_mqa_logits.validate import build_launch_args

    inputs = make_inputs(2, 1, 16, [100, 70], kv_block_size=64, max_model_len=128, device="cpu", seed=0)
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], False, 64,
                             q_scale=inputs["q_scale"])
    assert backends.get("triton") is not None
    started, stop, cpu_calls = threading.Event(), threading.Event(), []

    def cpu_calls_loop():
        while not stop.is_set():
            launch(args, backend="triton")
            cpu_calls.append(1)
            started.set()

    thread = threading.Thread(target=cpu_calls_loop)
    thread.start()
    errors = []
    try:
        started.wait(timeout=300)
        before = len(cpu_calls)
        for size in (4, 8, 16):
            src = ASTSource(max_kernel, {"x": "*fp32", "y": "*fp32", "out": "*fp32", "N": "constexpr"}, {"N": size})
            with knobs.cache.scope():
                knobs.cache.dir = str(tmp_path / f"cache{size}")
                try:
                    triton.compile(src, target=GPUTarget("cuda", 90, 32))
                except Exception as exc:  # noqa: BLE001 -- the assertion below names it
                    errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[-1]}")
        during = len(cpu_calls) - before
    finally:
        stop.set()
        thread.join()
    assert errors == [] and during >= 1, (errors, during)
