"""CPU CI for the sm_90 ``mma_v2`` variant (backends/gluon/mma_v2.py): every candidate of
the same five shapes as the CDNA CI (see test_compile_mfma.py for why they cover every
code-generating constexpr) plus the register-resident Q path is cross-compiled for sm_90 and
must pass ``compile.check_records``; resource parsing is cross-checked against ``ptxas -v``;
the real launch path runs on a simulated device.

36 kernels, about 20 s of wall time on 2 cores from a cold Triton cache (ptxas dominates).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from compile_matrix import SIZES, of_size  # noqa: E402
from test_compile_mfma import SHAPES  # noqa: E402
from paged_mqa_logits.triton_internals.compiler import GPUTarget  # noqa: E402
from paged_mqa_logits.triton_internals.device import simulated_device  # noqa: E402
from paged_mqa_logits.triton_internals.specialise import compiled_kernels  # noqa: E402
from paged_mqa_logits.triton_internals.toolchain import nvidia_tool, ptxas_for  # noqa: E402
from paged_mqa_logits.backends.gluon import BACKEND, common, mma_v2  # noqa: E402
from paged_mqa_logits.backends.gluon.kernels.register_mma import register_mma_logits_kernel  # noqa: E402
from paged_mqa_logits.aot.compile import check_records, compile_specs, nvidia_resources  # noqa: E402
from paged_mqa_logits.op import build_launch_args  # noqa: E402
from paged_mqa_logits.reference import make_inputs  # noqa: E402

MMA_V2 = mma_v2.VARIANT

ARCH = "sm_90"


def ci_matrix() -> list[dict]:
    configs = []
    for shape in SHAPES:
        problem = common.problem_for(ARCH, "fn", shape)
        configs += [dict(shape, **cand) for cand in MMA_V2.candidates(problem)]
    # Q and weights in registers (the path the AMD per-row kernel takes); 32 heads fit.
    configs.append(dict(SHAPES[1], ChunkK=64, num_warps=4, ReuseKV=0, QInLDS=0))
    return configs


@pytest.fixture(scope="module", params=SIZES)
def compiled(request, tmp_path_factory):
    specs = MMA_V2.compile_specs(ARCH, of_size(ci_matrix(), request.param))
    records = compile_specs(specs, str(tmp_path_factory.mktemp("mma_v2")), jobs=min(2, os.cpu_count() or 1),
                            progress=False)
    print(f"\nsm_90 mma_v2: {len(records)} kernels, {sum(r.seconds or 0 for r in records):.1f}s of compile time")
    return specs, records


def test_every_candidate_compiles_and_passes_the_checks(compiled):
    specs, records = compiled
    assert len({s.name for s in specs}) == len(specs)
    problems = check_records(records)
    assert not problems, "\n".join(problems)


def test_matrix_covers_every_knob_value(compiled):
    _, records = compiled
    seen = {k: {r.knobs[k] for r in records} for k in ("ChunkK", "num_warps", "ReuseKV", "QInLDS", "Prefetch",
                                                         "heads", "preshuffle", "lens_2d")}
    assert seen == {"ChunkK": {64, 128, 256}, "num_warps": {4, 8}, "ReuseKV": {0, 1}, "QInLDS": {0, 1},
                    "Prefetch": {0, 1}, "heads": {32, 64}, "preshuffle": {True, False}, "lens_2d": {True, False}}


def test_fp8_mma_sync_in_ptx_and_its_sass(compiled):
    """PTX: only ``mma.sync m16n8k32 e4m3``. sm_90 has no fp8 mma.sync in hardware: ptxas
    unpacks e4m3 to f16 (exact) and issues HMMA.16816 with fp32 accumulation."""
    _, records = compiled
    for r in records:
        ptx = [m for m in r.mma_instructions if m.startswith("mma")]
        assert ptx == ["mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"], (r.name, r.mma_instructions)
        if nvidia_tool("cuobjdump"):
            assert "HMMA.16816.F32" in r.mma_instructions, (r.name, r.mma_instructions)
            sass = open(r.isa[:-len(".ptx")] + ".sass").read()
            assert "F2FP.F16.E4M3.UNPACK_B" in sass


def test_keys_are_gathered_16_bytes_at_a_time(compiled):
    _, records = compiled
    for r in records:
        ptx = open(r.isa).read()
        assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx), r.name


def test_resources_agree_with_ptxas(compiled, tmp_path):
    """cuobjdump's resource usage (what the records hold) against ptxas -v on the same PTX (the
    ptxas Triton itself assembles sm_90 with: its PTX version follows that ptxas)."""
    ptxas = ptxas_for(90)
    if ptxas is None or nvidia_tool("cuobjdump") is None:
        pytest.skip("the Triton wheel carries no ptxas/cuobjdump")
    _, records = compiled
    record = next(r for r in records if r.knobs["QInLDS"] == 1 and r.knobs["ReuseKV"] == 1)
    ptx = open(record.isa).read()
    arch = re.search(r"^\.target (sm_\w+)", ptx, re.M).group(1)
    out = subprocess.run([ptxas, "-v", f"-arch={arch}", record.isa, "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    regs = int(re.search(r"Used (\d+) registers", out.stderr).group(1))
    spill_stores = int(re.search(r"(\d+) bytes spill stores", out.stderr).group(1))
    stack = int(re.search(r"(\d+) bytes stack frame", out.stderr).group(1))
    assert (regs, stack, spill_stores) == (record.vgprs, record.scratch_bytes, 0)
    res = nvidia_resources(record.binary)
    assert res["vgprs"] == regs and record.lds_bytes >= res["shared_static"]


# ----------------------------------------------------------------------------- host side
def test_candidates_fit_and_default_is_a_candidate():
    for shape in SHAPES:
        p = common.problem_for(ARCH, "fn", shape)
        cands = MMA_V2.candidates(p)
        assert cands and all(MMA_V2.admits(p, c) for c in cands)
        assert MMA_V2.default_config(p) in cands
        # not offered to the tuner beside wgmma (it never wins there), still launchable by name
        assert not any(c in BACKEND.candidates(p) for c in cands)
        assert BACKEND.check_config(cands[0], p) is None


def test_unsupported_reasons():
    p = common.problem_for(ARCH, "fn", {})
    assert MMA_V2.unsupported(p) is None
    assert "gfx942" in MMA_V2.unsupported(common.problem_for("gfx942", "fnuz", {}))
    assert "e4m3fn" in MMA_V2.unsupported(dataclasses.replace(p, fp8="fnuz"))
    assert "head_dim" in MMA_V2.unsupported(dataclasses.replace(p, shape_key=dataclasses.replace(p.shape_key,
                                                                                                 head_dim=64)))


@pytest.mark.parametrize("lens_2d", [True, False])
def test_launch_path_binds_specialises_and_compiles(lens_2d):
    inputs = make_inputs(2, 3, 32, [90, 33], kv_block_size=32, preshuffle=False, lens_2d=lens_2d, seed=2,
                         out_row_pad=2, table_row_pad=3)
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], False, 32)
    args.problem = dataclasses.replace(args.problem, arch=ARCH, cu_num=132)
    config = {"variant": "mma_v2", "ChunkK": 64, "num_warps": 4, "SplitKV": 2, "ReuseKV": 1}
    kernel = register_mma_logits_kernel
    with simulated_device(GPUTarget("cuda", 90, 32), [kernel]) as launches:
        BACKEND.launch(args, config)
        kernels = compiled_kernels(kernel)
    assert len(launches) == 1 and len(kernels) == 1
    assert launches[0].grid == (2 * 2 * 1, 1, 1)  # batch x SplitKV x one row group (ReuseKV)
    assert launches[0].metadata.num_warps == 4
    runtime = common.kernel_arguments(args, 2)
    assert launches[0].args[7:len(runtime)] == runtime[7:]
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in kernels[0].asm["ptx"]
    assert torch.isnan(inputs["out_logits"]).all()  # nothing ran: the simulated device only records
