"""Hash the compiled code of a sample of the shipped table's Gluon kernels, line info left out.

``python tools/compile_hashes.py [PER_ARCH]`` compiles every k-th distinct kernel the tuned
tables can pick (``PER_ARCH`` of them per arch, 40 by default) for sm_90, gfx942 and gfx950 and
prints ``name sha256`` of its PTX or AMDGCN with ``.loc``/``.file`` lines and debug sections
removed. Run it before and after a change that must not alter any kernel, and diff the outputs.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tempfile

from paged_mqa_logits.aot.compile import ARCHS, backend_specs, compile_spec

_LINE_INFO = re.compile(r"^\s*(\.loc|\.file)\b")


def code_hash(text: str) -> str:
    """sha256 of compiled code without what moves when a source line moves."""
    text = text.split(".section\t.debug", 1)[0].split(".section .debug", 1)[0]
    kept = [line for line in text.splitlines() if not _LINE_INFO.match(line)]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def sample(specs: list, count: int) -> list:
    step = max(1, len(specs) // count)
    return specs[::step][:count]


def main(argv: list[str]) -> int:
    per_arch = int(argv[0]) if argv else 40
    with tempfile.TemporaryDirectory(prefix="pml_hashes_") as out:
        for arch in ARCHS:
            specs = sorted(backend_specs("gluon", arch, only_table=True), key=lambda s: s.name)
            for spec in sample(specs, per_arch):
                record = compile_spec(spec, out)
                if not record.ok:
                    print(f"{spec.name} FAILED {record.error}", flush=True)
                    continue
                with open(record.isa) as f:
                    print(f"{spec.name} {code_hash(f.read())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
