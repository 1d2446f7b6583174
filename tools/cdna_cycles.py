"""A cycle model of one CDNA3 / CDNA4 (gfx942 / gfx950) kernel loop, from its ISA alone.

No AMD GPU is available to this project, so kernels are ranked by what the hardware would have
to execute in their steady-state loop (the hottest loop of the ISA, :func:`hot_loop`). Every
number is in GPU clocks of one SIMD.

**Pipes** (per wave and loop iteration; :func:`profile`). A SIMD runs the waves resident on it;
what they share bounds the loop from below, whatever the latency hiding:

* ``mfma``: the matrix pipe, ``4 x passes`` per MFMA (:data:`MFMA_PASSES`, the chips' ISA
  tables: an fp8 ``16x16x32`` is 4 passes on both chips, gfx950's ``f8f6f4`` ``16x16x128`` with
  fp8 operands 8 and ``32x32x64`` 16, so twice the plain MFMA's rate);
* ``valu``: the vector issue port: 4 clocks per VALU pass (:data:`TWO_PASS_VALU` take 8) and 4
  per MFMA issue;
* ``salu``: 4 clocks per scalar instruction;
* ``vmem``: the CU's vector-memory path (64 lanes of addresses in 4 clocks, 64 bytes of data a
  clock, :data:`VMEM_BYTES_PER_CLOCK`), shared by the CU's 4 SIMDs, so charged 4x to one SIMD
  when all four run the same loop: 64 clocks per ``dwordx4`` load or store, 16 per narrower one;
* ``lds``: the CU's LDS (128 bytes a clock, :data:`LDS_BYTES_PER_CLOCK`), shared the same way:
  32 clocks per ``b128`` access, 8 per 4-byte one (``ds_bpermute`` included).

**Latency** (:func:`single_wave_cycles`): one wave alone, issuing in order, one instruction
every 4 clocks; an MFMA waits for the matrix pipe and an MFMA result is read ``4 x passes + 8``
clocks after issue; ``s_waitcnt vmcnt(N)`` / ``lgkmcnt(N)`` wait until all but the ``N`` newest
vector-memory / LDS-scalar operations completed, each ``VMEM_LATENCY`` / ``LDS_LATENCY`` /
``SMEM_LATENCY`` clocks after issue, in issue order; ``s_nop N`` idles ``N + 1`` issue slots.
Forward branches inside the loop are taken as falling through (every block runs), the loop
body is replayed until its iteration time is steady, and barriers cost only their issue slot.

**Estimate** (:func:`estimate`): with ``W`` waves per SIMD (the occupancy the registers and
LDS allow, at most the kernel's ``WavePerEU``), an iteration costs
``max(pipes..., single_wave / W)``: the busiest shared pipe, or one wave's latency divided
among the waves that hide it. Its name is the bound (``mfma``, ``valu``, ``salu``, ``vmem``,
``lds``, ``latency``). Normalised by the score MFMAs' work of the iteration (fp8 operands; a bf16 head-sum MFMA
costs pipe time but scores nothing) to **cycles per 64 keys**:
one wave's clocks to score 64 keys against every query row of a sequence (all heads), which
compares kernels that split rows, heads and keys differently.

Calibration: ``VMEM_LATENCY`` is the one free constant; it was chosen (:data:`CALIBRATION`)
so that AITER's Gluon kernel, compiled here, shows its published MI355X tuned-vs-default gain.
What this cannot see is listed in docs/VERIFICATION.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from paged_mqa_logits.aot.compile import amd_hot_loop

#: the model's name in table provenances (``estimate:<MODEL>``); a change of the model's
#: constants or rules gets a new name
MODEL = "cdna-cycles-1"
ISSUE = 4  # clocks between two instructions of one wave
SIMDS_PER_CU = 4
VMEM_BYTES_PER_CLOCK = 64  # vector L1 -> registers, per CU
LDS_BYTES_PER_CLOCK = 128  # per CU
LANES = 64
#: clocks from issue to data, per counter (VMEM_LATENCY calibrated, see CALIBRATION)
VMEM_LATENCY = 1000
LDS_LATENCY = 64
SMEM_LATENCY = 200
CALIBRATION = ("VMEM_LATENCY 1000 clocks: AITER's Gluon kernel (gfx950, H 32, KVBlockSize 64, Preshuffle) at its "
               "MI355X tuned picks (ChunkK 128/256, WavePerEU 4) against its default (ChunkK 256, WavePerEU 2)")

#: matrix-pipe passes (4 clocks each) per MFMA mnemonic fragment, fp8 operands
MFMA_PASSES = {
    "16x16x32_fp8": 4, "16x16x32_bf8": 4, "32x32x16_fp8": 8, "32x32x16_bf8": 8,
    "16x16x128_f8f6f4": 8, "32x32x64_f8f6f4": 16,
    # bf16 (the HeadSum=tensor head sum): gfx942 256 and gfx950 512 multiply-adds per clock and
    # SIMD on its K-doubled forms (the chips' peak bf16 rates), the older forms as gfx942's
    "32x32x8_bf16": 8, "32x32x8bf16": 8, "16x16x16_bf16": 4, "16x16x16bf16": 4,
    "32x32x16_bf16": 8, "16x16x32_bf16": 4,
}
#: MFMA operand types that score keys (fp8); other MFMAs (the bf16 head sum) are not the work
#: :func:`estimate` normalises by
SCORE_OPERANDS = ("fp8", "bf8", "f8f6f4")
#: VALU instructions that take two passes (64-bit integer multiply-adds, lane swaps)
TWO_PASS_VALU = ("v_mad_u64_u32", "v_mad_i64_i32", "v_permlane16_swap", "v_permlane32_swap", "v_lshl_add_u64")
PIPES = ("mfma", "valu", "salu", "vmem", "lds")

# ----------------------------------------------------------------------------- the loop
hot_loop = amd_hot_loop


def mnemonic(line: str) -> str:
    return line.split()[0]


def mfma_passes(name: str) -> int:
    for fragment, passes in MFMA_PASSES.items():
        if fragment in name:
            return passes
    raise ValueError(f"no pass count for MFMA {name!r}: add it to MFMA_PASSES")


def mfma_macs(name: str) -> int:
    """Multiply-accumulates of one MFMA (``M x N x K``) from its mnemonic."""
    m = re.search(r"_(\d+)x(\d+)x(\d+)", name)
    if not m:
        raise ValueError(f"no MxNxK in MFMA {name!r}")
    a, b, c = map(int, m.groups())
    return a * b * c


def vmem_bytes(name: str) -> int:
    """Bytes one lane moves with a vector-memory instruction (0 for non-VMEM)."""
    if not name.startswith(("buffer_", "global_")) or "atomic" in name:
        return 0
    m = re.search(r"dwordx(\d)", name)
    if m:
        return 4 * int(m.group(1))
    for suffix, size in (("dword", 4), ("short", 2), ("ubyte", 1), ("sbyte", 1), ("b128", 16), ("b64", 8),
                         ("b32", 4), ("b16", 2), ("u8", 1), ("i8", 1)):
        if suffix in name:
            return size
    return 4


def lds_bytes(name: str) -> int:
    if not name.startswith("ds_"):
        return 0
    m = re.search(r"b(\d+)", name)
    if m:
        return int(m.group(1)) // 8
    return 1 if re.search(r"[ui]8", name) else 2 if re.search(r"[ui]16", name) else 4


def kind(name: str) -> str:
    """``mfma``, ``valu``, ``salu``, ``vmem``, ``lds``, ``smem``, ``waitcnt``, ``nop``, ``other``."""
    if name.startswith("v_mfma"):
        return "mfma"
    if name.startswith(("buffer_", "global_")):
        return "vmem"
    if name.startswith("ds_"):
        return "lds"
    if name.startswith(("s_load", "s_buffer_load")):
        return "smem"
    if name == "s_waitcnt":
        return "waitcnt"
    if name == "s_nop":
        return "nop"
    if name.startswith("v_"):
        return "valu"
    if name.startswith("s_"):
        return "salu"
    return "other"


# ----------------------------------------------------------------------------- pipes
@dataclass
class LoopProfile:
    """What one wave executes per iteration of the loop, and what it costs the SIMD."""

    instructions: int = 0
    counts: dict = field(default_factory=dict)  # per kind
    mfma_kinds: dict = field(default_factory=dict)  # mnemonic -> count
    macs: int = 0  # of the score MFMAs
    vmem_bytes: int = 0  # per wave
    waitcnts: int = 0
    pipes: dict = field(default_factory=dict)  # clocks per pipe
    single_wave: float = 0.0  # clocks of one wave alone


def profile(lines: list[str]) -> LoopProfile:
    p = LoopProfile(instructions=len(lines), pipes=dict.fromkeys(PIPES, 0))
    for line in lines:
        name = mnemonic(line)
        k = kind(name)
        p.counts[k] = p.counts.get(k, 0) + 1
        if k == "mfma":
            p.mfma_kinds[name] = p.mfma_kinds.get(name, 0) + 1
            if any(t in name for t in SCORE_OPERANDS):
                p.macs += mfma_macs(name)
            p.pipes["mfma"] += ISSUE * mfma_passes(name)
            p.pipes["valu"] += ISSUE
        elif k == "valu":
            p.pipes["valu"] += ISSUE * (2 if name.startswith(TWO_PASS_VALU) else 1)
        elif k in ("salu", "smem"):
            p.pipes["salu"] += ISSUE
        elif k == "vmem":
            size = vmem_bytes(name)
            p.vmem_bytes += size * LANES
            # addresses: 16 lanes a clock; data: VMEM_BYTES_PER_CLOCK; the CU's 4 SIMDs share it
            p.pipes["vmem"] += SIMDS_PER_CU * max(LANES // 16, size * LANES // VMEM_BYTES_PER_CLOCK)
        elif k == "lds":
            p.pipes["lds"] += SIMDS_PER_CU * max(2, lds_bytes(name) * LANES // LDS_BYTES_PER_CLOCK)
        elif k == "waitcnt":
            p.waitcnts += 1
    p.single_wave = single_wave_cycles(lines)
    return p


# ----------------------------------------------------------------------------- latency
_REG = re.compile(r"\b([vsa])(?:\[(\d+):(\d+)\]|(\d+)\b)")


def _registers(operand_text: str) -> set[str]:
    regs = set()
    for kind_letter, lo, hi, single in _REG.findall(operand_text):
        first, last = (int(lo), int(hi)) if lo else (int(single), int(single))
        regs.update(f"{kind_letter}{r}" for r in range(first, last + 1))
    return regs


def _operands(line: str) -> tuple[set[str], set[str]]:
    """(written, read) registers: the first operand is the destination except for stores,
    waits, branches and writes to memory."""
    parts = line.split(None, 1)
    if len(parts) == 1:
        return set(), set()
    ops = [o.strip() for o in parts[1].split(",")]
    name = parts[0]
    if "store" in name or "write" in name or name.startswith(("s_waitcnt", "s_cbranch", "s_branch", "s_nop")):
        return set(), _registers(parts[1])
    return _registers(ops[0]), _registers(",".join(ops[1:]))


def _counter_wait(text: str) -> dict[str, int]:
    return {c: int(n) for c, n in re.findall(r"(vmcnt|lgkmcnt)\((\d+)\)", text)}


def single_wave_cycles(lines: list[str], iterations: int = 8) -> float:
    """Steady-state clocks of one loop iteration of a wave running alone (module docstring)."""
    if not lines:
        return 0.0
    ready: dict[str, float] = {}  # register -> clock its value is available
    accumulated: dict[str, float] = {}  # MFMA results -> clock another MFMA may accumulate onto them
    pending = {"vmcnt": [], "lgkmcnt": []}  # completion clocks, in issue order
    t = 0.0
    mfma_free = 0.0
    ends = []
    for _ in range(iterations):
        for line in lines:
            name = mnemonic(line)
            k = kind(name)
            written, read = _operands(line)
            if k == "mfma":  # an MFMA accumulating onto an MFMA result takes it from the pipe
                start = max([t] + [accumulated.get(r, ready.get(r, 0.0)) for r in read])
            else:
                start = max([t] + [ready.get(r, 0.0) for r in read])
            if k == "waitcnt":
                for counter, keep in _counter_wait(line).items():
                    queue = pending[counter]
                    if len(queue) > keep:
                        start = max(start, max(queue[:len(queue) - keep]))
                        del queue[:len(queue) - keep]
            if k == "mfma":
                start = max(start, mfma_free)
                mfma_free = start + ISSUE * mfma_passes(name)
                for r in written:
                    ready[r] = mfma_free + 2 * ISSUE
                    accumulated[r] = mfma_free
            elif k == "vmem":
                pending["vmcnt"].append(start + VMEM_LATENCY)
                if "load" in name:
                    for r in written:
                        ready[r] = 0.0  # ordered by s_waitcnt, not by the scoreboard
            elif k in ("lds", "smem"):
                pending["lgkmcnt"].append(start + (LDS_LATENCY if k == "lds" else SMEM_LATENCY))
                pending["lgkmcnt"].sort()
                for r in written:
                    ready[r] = 0.0
            elif k == "valu":
                for r in written:
                    accumulated.pop(r, None)
                    ready[r] = start + ISSUE * (2 if name.startswith(TWO_PASS_VALU) else 1)
            step = ISSUE
            if k == "nop":
                step = ISSUE * (int(line.split()[1], 0) + 1 if len(line.split()) > 1 else 1)
            t = start + step
        ends.append(t)
    half = iterations // 2
    return (ends[-1] - ends[half - 1]) / (iterations - half)


# ----------------------------------------------------------------------------- the estimate
@dataclass
class Estimate:
    cycles_per_iteration: float
    bound: str
    cycles_per_64_keys: float  # one wave, 64 keys x every query row of the sequence
    scale: float  # iterations per 64 keys x rows


def estimate(p: LoopProfile, waves_per_simd: int, heads: int, rows_per_sequence: int, head_dim: int = 128) -> Estimate:
    """Cycles of one loop iteration at ``waves_per_simd`` resident waves, and per 64 keys of a
    sequence scored against its ``rows_per_sequence`` (next_n) query rows, ``heads`` each."""
    if not p.macs:
        raise ValueError("the loop has no MFMA: nothing to normalise by")
    candidates = dict(p.pipes, latency=p.single_wave / max(waves_per_simd, 1))
    bound = max(candidates, key=candidates.get)
    cycles = candidates[bound]
    scale = 64 * heads * head_dim * rows_per_sequence / p.macs
    return Estimate(cycles, bound, cycles * scale, scale)
