"""The Triton release the sm_90 kernels' register splits and fit rules are calibrated on, how
the compile tests judge spills off it, and the ptxas report they read registers from.

On Triton 3.6 (the H200's) no tile loop may touch local memory. Triton 3.9 allocates more
registers for some of the same warp-specialised kernels (local loads and stores in their tile
loops); there every other check holds and hot-loop spills are reported, not failed, until the
kernels are calibrated and measured on it (docs/VERIFICATION.md)."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import triton

from paged_mqa_logits.aot.compile import check_records
from paged_mqa_logits.triton_internals.toolchain import ptxas_for
from paged_mqa_logits.triton_internals.version import parse_version

CALIBRATED = parse_version(triton.__version__) == (3, 6)


def problems_off_calibration(records) -> list[str]:
    """``check_records``' verdicts; off the calibrated Triton, hot-loop spills printed instead."""
    problems = check_records(records)
    if not CALIBRATED:
        for line in [p for p in problems if p.endswith("register spills")]:
            print("\n" + line)
            problems.remove(line)
    return problems


def ptxas_logs(records) -> list[str]:
    """``ptxas -v`` of each compiled record's PTX (empty for a failed compile), assembled by the
    ptxas Triton itself uses for sm_90 (its PTX version follows it)."""
    ptxas = ptxas_for(90)

    def log(record):
        if not record.ok:
            return ""
        run = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", record.isa, "-o", os.devnull], capture_output=True,
                             text=True)
        return run.stdout + run.stderr

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(log, records))
