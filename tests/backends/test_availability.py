"""Every backend's two judgements kept apart: ``unsupported(problem)`` judges what a call is
(arch, shapes, fp8 flavour, cache layout) and never where it would run; ``unavailable(target)``
judges whether this machine can launch the backend's kernels for a target, and dispatch asks it
only for a target that is not hypothetical (``registry.why_not``)."""

import ast
import itertools
import os

import pytest

from paged_mqa_logits import backends
from paged_mqa_logits.backends import registry
from paged_mqa_logits.backends.flydsl.toolchain import NOT_INSTALLED
from paged_mqa_logits.problem import TARGET_ONLY_FIELDS, Problem, ShapeKey, Target

BACKENDS_DIR = os.path.dirname(registry.__file__)
NAMES = ("torch", "triton", "gluon", "flydsl")
#: backend -> the archs below it serves some call of
SERVES = {"torch": {"cpu", "sm_90", "gfx942", "gfx950"}, "triton": {"cpu", "sm_90", "gfx942", "gfx950"},
          "gluon": {"sm_90", "gfx942", "gfx950"}, "flydsl": {"gfx942", "gfx950"}}


def shape_keys():
    for heads, next_n, (kv_block_size, preshuffle) in itertools.product(
            (32, 48, 64), (1, 2, 9), ((1, False), (64, True), (128, False))):
        yield ShapeKey(heads=heads, head_dim=128, kv_block_size=kv_block_size, preshuffle=preshuffle, batch=4,
                       next_n=next_n)


def targets(arch: str, cu_num: int):
    """The same chip as every device type and as a call made or only described."""
    return [Target(arch, cu_num, device_type, hypothetical)
            for device_type in ("cpu", "cuda", "meta") for hypothetical in (False, True)]


def test_the_registry_lists_the_backends_under_test():
    assert set(NAMES) <= set(backends.names())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arch, cu_num", [("cpu", 0), ("sm_90", 132), ("gfx942", 304), ("gfx950", 256)])
def test_unsupported_gives_one_verdict_whatever_the_target(name, arch, cu_num):
    """The guarantee that backends never read tooling flags: a problem is built from a target's
    chip only, so the verdict on a call is the same on GPU tensors, CPU tensors or described."""
    backend = backends.get(name)
    served = 0
    for key in shape_keys():
        for fp8 in ("fn", "fnuz"):
            problems = {Problem.of(key, t, context=8192, max_model_len=8192, fp8=fp8) for t in targets(arch, cu_num)}
            assert len(problems) == 1
            problem = problems.pop()
            verdict = backend.unsupported(problem)
            served += verdict is None
            for target in targets(arch, cu_num):
                reason = registry.why_not(name, problem, target)
                if target.hypothetical or verdict is not None:
                    assert reason == verdict, (problem.describe(), target)
                else:
                    assert reason == backend.unavailable(target), (problem.describe(), target)
    assert bool(served) == (arch in SERVES[name])


def test_each_backend_says_where_it_cannot_launch():
    cpu, gpu, meta = (Target("gfx950", 256, device_type) for device_type in ("cpu", "cuda", "meta"))
    torch_backend, triton_backend, gluon, flydsl = (backends.get(n) for n in NAMES)
    assert [torch_backend.unavailable(t) for t in (cpu, gpu, meta)] == [None, None, None]
    assert [triton_backend.unavailable(t) for t in (cpu, gpu)] == [None, None]
    assert triton_backend.unavailable(meta) == "device type meta is not a Triton target"
    assert gluon.unavailable(gpu) is None
    assert gluon.unavailable(cpu) == "gluon kernels run on GPU tensors only, got cpu tensors"
    assert flydsl.unavailable(cpu) in (NOT_INSTALLED, "no ROCm runtime: the tensors are on cpu")


def test_only_unavailable_reads_the_target_only_fields():
    """No backend module reads ``device_type`` or ``hypothetical`` except in ``unavailable`` (and
    the registry's ``why_not``, which decides whether to ask it)."""
    readers = []
    for root, _dirs, files in os.walk(BACKENDS_DIR):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(root, file)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for function in ast.walk(tree):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                reads = [n.attr for n in ast.walk(function)
                         if isinstance(n, ast.Attribute) and n.attr in TARGET_ONLY_FIELDS]
                if reads and function.name not in ("unavailable", "why_not"):
                    readers.append(f"{os.path.relpath(path, BACKENDS_DIR)}:{function.name} reads {', '.join(reads)}")
    assert not readers
    assert set(TARGET_ONLY_FIELDS) == {"device_type", "hypothetical"}
