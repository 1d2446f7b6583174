"""FlyDSL's global->LDS copies (inline asm: ``s_mov_b32 m0``, ``s_nop 0``, ``buffer_load_dword[x4]
... offen lds``; see ``backends/flydsl/ir.py``) checked against what LLVM itself emits for
``llvm.amdgcn.raw.ptr.buffer.load.lds`` on gfx942 and gfx950.

LLVM is asked twice per chip and width, through the LLVM bundled with Triton:

* with nothing to schedule between the M0 write and the copy, so its hazard recognizer has to
  insert the M0 -> LDS-DMA wait states itself: that count is the one the hardware needs;
* with a per-lane offset, a uniform soffset and an LDS read of the copied data: the instruction
  form, and the wait (``vmcnt``, not ``lgkmcnt``) LLVM puts before reading LDS-DMA data.

One FlyDSL kernel per chip (compile-only) must then show, at every copy, an M0 write in the same
basic block with at least LLVM's wait states before it, LLVM's instruction form, and before every
``ds_read_b128`` of a stage an ``s_waitcnt vmcnt(0)`` then ``s_barrier`` with no copy issued
between the two (copies issued after the barrier fill the other stage: the emulator tests check
which stage each read and copy touches). docs/VERIFICATION.md says what this leaves to hardware.
"""

import re

import pytest

from paged_mqa_logits.backends.flydsl import build
from paged_mqa_logits.backends.flydsl.backend import BACKEND, NOT_INSTALLED, flydsl_installed

#: (arch, bytes per lane) of the copies FlyDSL issues: gfx942 only has the 4-byte form
COPIES = (("gfx942", 4), ("gfx950", 4), ("gfx950", 16))
#: the width of FlyDSL's key copies on each chip
FLYDSL_COPY_BYTES = {"gfx942": 4, "gfx950": 16}

_DECLARATIONS = """
target triple = "amdgcn-amd-amdhsa"
declare ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1), i16, i64, i32)
declare void @llvm.amdgcn.raw.ptr.buffer.load.lds(ptr addrspace(8), ptr addrspace(3), i32, i32, i32, i32, i32)
declare i32 @llvm.amdgcn.workitem.id.x()
"""

#: the copy alone: M0 comes straight from a kernel argument, nothing can sit before the copy
_COPY_ONLY = _DECLARATIONS + """
define amdgpu_kernel void @copy_only(ptr addrspace(1) %src, ptr addrspace(3) %lds) {
  %rsrc = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %src, i16 0, i64 4096, i32 159744)
  call void @llvm.amdgcn.raw.ptr.buffer.load.lds(ptr addrspace(8) %rsrc, ptr addrspace(3) %lds, i32 BYTES, i32 0, i32 0, i32 0, i32 0)
  ret void
}
"""

#: per-lane voffset, uniform soffset, then an LDS read of what the copy wrote
_COPY_THEN_READ = _DECLARATIONS + """
define amdgpu_kernel void @copy_then_read(ptr addrspace(1) %src, ptr addrspace(3) %lds, i32 %soffset) {
  %lane = call i32 @llvm.amdgcn.workitem.id.x()
  %voffset = mul i32 %lane, BYTES
  %rsrc = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %src, i16 0, i64 4096, i32 159744)
  call void @llvm.amdgcn.raw.ptr.buffer.load.lds(ptr addrspace(8) %rsrc, ptr addrspace(3) %lds, i32 BYTES, i32 %voffset, i32 %soffset, i32 0, i32 0)
  %at = getelementptr i8, ptr addrspace(3) %lds, i32 %voffset
  %copied = load i32, ptr addrspace(3) %at
  %out = getelementptr i8, ptr addrspace(1) %src, i32 %voffset
  store i32 %copied, ptr addrspace(1) %out
  ret void
}
"""

_COPY = re.compile(r"^buffer_load_dword(x4)?\s.*\blds$")
_WRITES_M0 = re.compile(r"^s_\w+\s+m0,")
_LABEL = re.compile(r"^[.\w]+:")


def instructions(isa: str) -> list[str]:
    """The kernel body's instructions and labels, comments and directives dropped."""
    out = []
    for line in isa.splitlines():
        text = line.split(";")[0].strip()
        if not text or text.startswith("."):
            if _LABEL.match(text or "-"):
                out.append(text)
            continue
        if text == "s_endpgm":
            out.append(text)
            break
        out.append(text)
    return out


def copy_form(instruction: str) -> str:
    """The copy's shape with registers abstracted: ``buffer_load_dwordx4 v, s[], s offen lds``."""
    text = re.sub(r"s\[\d+:\d+\]", "s[]", instruction)
    text = re.sub(r"\b[vs]\d+\b", lambda m: m.group(0)[0], text)
    return " ".join(text.split())


def wait_states(between: list[str]) -> int:
    """Wait states the instructions ``between`` two others provide: ``s_nop N`` gives N + 1."""
    total = 0
    for text in between:
        nop = re.match(r"^s_nop\s+(\d+)$", text)
        total += int(nop.group(1)) + 1 if nop else 1
    return total


def copies(body: list[str]) -> list[tuple[str, int]]:
    """(form, wait states since the M0 write) of every LDS-DMA copy; the M0 write must be in the
    copy's basic block (no label between), else the copy has no M0 of its own."""
    out = []
    for i, text in enumerate(body):
        if not _COPY.match(text):
            continue
        j = i - 1
        while j >= 0 and not _WRITES_M0.match(body[j]):
            assert not _LABEL.match(body[j]), f"no M0 write in the basic block of copy {i}: {text}"
            j -= 1
        assert j >= 0, f"no M0 write before copy {i}: {text}"
        out.append((copy_form(text), wait_states(body[j + 1:i])))
    return out


def waits_since_copy(body: list[str], read: str) -> list[str]:
    """For every ``read`` instruction: the waits between the last copy (in its block) and it."""
    out = []
    for i, text in enumerate(body):
        if text.startswith(read):
            waits = []
            for before in reversed(body[:i]):
                if _COPY.match(before) or _LABEL.match(before):
                    break
                if before.startswith(("s_waitcnt", "s_barrier")):
                    waits.insert(0, before)
            out.append(" ; ".join(waits))
    return out


def stage_synced(body: list[str], i: int) -> bool:
    """Whether the LDS read at ``i`` follows, in its basic block, an ``s_barrier`` that follows an
    ``s_waitcnt vmcnt(0)`` with no copy between the two: every copy issued before the barrier has
    landed, in every wave."""
    j = i - 1
    while j >= 0 and body[j] != "s_barrier":
        if _LABEL.match(body[j]):
            return False
        j -= 1
    for before in reversed(body[:max(j, 0)]):
        if _COPY.match(before) or _LABEL.match(before):
            return False
        if re.match(r"^s_waitcnt\b.*\bvmcnt\(0\)", before):
            return True
    return False


@pytest.fixture(scope="module")
def llvm_isa():
    """LLVM's lowering of the intrinsic per (arch, bytes): the two kernels above."""
    pytest.importorskip("triton")
    from paged_mqa_logits.triton_internals.toolchain import amdgcn_from_llvm_ir

    return {(arch, nbytes): {name: instructions(amdgcn_from_llvm_ir(ir.replace("BYTES", str(nbytes)), arch))
                             for name, ir in (("copy_only", _COPY_ONLY), ("copy_then_read", _COPY_THEN_READ))}
            for arch, nbytes in COPIES}


@pytest.fixture(scope="module")
def flydsl_isa(tmp_path_factory):
    """One FlyDSL kernel per chip (h32, next_n 1, ChunkK 64: the smallest), compile-only."""
    if not flydsl_installed():
        pytest.skip(NOT_INSTALLED)
    out = {}
    for arch in FLYDSL_COPY_BYTES:
        problem = build._problem(arch, 32, 1, 64, True, True)
        plan = next(p for p in (BACKEND.plan(problem, c) for c in [{"ChunkK": 64, "WavePerEU": 2, "Schedule": "balanced"}])
                    if p.config_error() is None)
        (record,) = build.compile_plans(arch, [plan], str(tmp_path_factory.mktemp(arch)), progress=False)
        with open(record.isa) as f:
            out[arch] = instructions(f.read())
    return out


@pytest.mark.parametrize("arch,nbytes", COPIES)
def test_what_llvm_emits(llvm_isa, arch, nbytes):
    """The facts the FlyDSL check below relies on, as this LLVM states them."""
    op = {4: "buffer_load_dword", 16: "buffer_load_dwordx4"}[nbytes]
    ((form, waits),) = copies(llvm_isa[arch, nbytes]["copy_only"])
    assert form == f"{op} off, s[], 0 lds"
    assert waits == 1  # the hazard recognizer's s_nop 0 between s_mov_b32 m0 and the copy
    body = llvm_isa[arch, nbytes]["copy_then_read"]
    ((form, _),) = copies(body)
    assert form == f"{op} v, s[], s offen lds"
    (waits,) = waits_since_copy(body, "ds_read")
    assert "vmcnt(0)" in waits  # LLVM counts LDS-DMA completion on vmcnt, not lgkmcnt


@pytest.mark.parametrize("arch", sorted(FLYDSL_COPY_BYTES))
def test_flydsl_copies_match_llvm(llvm_isa, flydsl_isa, arch):
    body = flydsl_isa[arch]
    required_waits = copies(llvm_isa[arch, FLYDSL_COPY_BYTES[arch]]["copy_only"])[0][1]
    (llvm_form,) = {form for form, _ in copies(llvm_isa[arch, FLYDSL_COPY_BYTES[arch]]["copy_then_read"])}
    found = copies(body)
    assert len(found) >= 2  # the prologue's copies and the loop's
    assert {form for form, _ in found} == {llvm_form}
    assert min(waits for _, waits in found) >= required_waits
    reads = [i for i, text in enumerate(body) if text.startswith("ds_read_b128")]
    assert reads
    for i in reads:
        assert stage_synced(body, i), f"LDS read {i} ({body[i]}) without vmcnt(0) + barrier before it"
