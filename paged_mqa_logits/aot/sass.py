"""Reading ``cuobjdump -sass`` listings: instructions with their addresses, and the loops that
backward branches close, so the compile checks and the tests can ask what a kernel's hot loops
hold (their matrix instructions, their local-memory traffic) without a GPU."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


@dataclass(frozen=True)
class Instruction:
    address: int
    text: str

    @property
    def opcode(self) -> str:
        words = self.text.split()
        op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")
        return op


def disassemble(cuobjdump: str, cubin: str) -> list[Instruction]:
    listing = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return parse(listing)


def hot_loop_spills(listing: str) -> int:
    """Local loads and stores inside the loops that issue matrix instructions (``*MMA``):
    the spills that cost every iteration. A warp-specialised kernel may keep a little local
    memory elsewhere (a producer warp given few registers, a prologue) at no such cost."""
    code = parse(listing)
    loops_ = [lp for prefix in ("HMMA", "QGMMA", "HGMMA", "IMMA", "QMMA") for lp in innermost_loops_with(code, prefix)]
    return len({i.address for lp in loops_ for i in local_memory(lp)})


def parse(listing: str) -> list[Instruction]:
    return [Instruction(int(m.group(1), 16), m.group(2)) for m in map(_LINE.search, listing.splitlines()) if m]


def loops(code: list[Instruction]) -> list[list[Instruction]]:
    """The instructions of every loop: from a backward branch's target to the branch."""
    out = []
    for inst in code:
        m = _BRANCH.search(inst.text)
        if m and int(m.group(1), 16) < inst.address:
            start = int(m.group(1), 16)
            out.append([i for i in code if start <= i.address <= inst.address])
    return out


def innermost_loops_with(code: list[Instruction], opcode_prefix: str) -> list[list[Instruction]]:
    """The loops holding an instruction whose opcode starts with ``opcode_prefix`` that overlap
    no shorter such loop (e.g. each consumer's tile loop for ``QGMMA``: a loop around it, or
    one that a rotated loop layout makes overlap it, is not the hot loop)."""
    found = [lp for lp in loops(code) if any(i.opcode.startswith(opcode_prefix) for i in lp)]
    spans = [(lp[0].address, lp[-1].address) for lp in found]
    return [lp for lp, (a, b) in zip(found, spans)
            if not any(b2 - a2 < b - a and a2 <= b and a <= b2 for a2, b2 in spans)]


def local_memory(instructions: list[Instruction]) -> list[Instruction]:
    """Spill traffic: local loads and stores."""
    return [i for i in instructions if i.opcode.split(".")[0] in ("LDL", "STL")]
