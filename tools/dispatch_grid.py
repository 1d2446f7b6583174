"""Dump the dispatch decision (backend, variant, knobs) over a fixed grid of described problems.

Run it before and after a change that must not move any decision, and diff the two outputs:
``python tools/dispatch_grid.py > before.txt`` ... ``diff before.txt after.txt``. The grid is
1440 problems: arch (sm_90, gfx942, gfx950) x heads (32, 64) x next_n (1, 2, 4) x batch
(1, 8, 32, 128, 256) x context (4096, 65536) x kv_block_size (32, 64) x preshuffle (0, 1) x
kv_format (fp8, fp4). The table row's file and line are left out: a schema change moves lines,
not decisions.
"""

from __future__ import annotations

import itertools
import sys

from paged_mqa_logits.explain import explain

ARCHS = {"sm_90": 132, "gfx942": 304, "gfx950": 256}
GRID = dict(heads=(32, 64), next_n=(1, 2, 4), batch=(1, 8, 32, 128, 256), context=(4096, 65536),
            kv_block_size=(32, 64), preshuffle=(0, 1), kv_format=("fp8", "fp4"))


def decision(**problem) -> str:
    try:
        choice = explain(**problem)
    except Exception as exc:  # a problem no backend serves is a decision too
        return f"error {type(exc).__name__}: {str(exc).splitlines()[0]}"
    knobs = " ".join(f"{k}={v}" for k, v in sorted(choice.config.items()))
    return f"{choice.backend} {knobs}"


def main() -> int:
    names = tuple(GRID)
    for arch, cu_num in ARCHS.items():
        for values in itertools.product(*GRID.values()):
            problem = dict(zip(names, values), arch=arch, cu_num=cu_num, head_dim=128)
            problem["preshuffle"] = bool(problem["preshuffle"])
            label = " ".join(f"{k}={problem[k]}" for k in ("arch", *names))
            print(f"{label} -> {decision(**problem)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
