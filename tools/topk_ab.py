"""Same-run A/B of ``triton_sample``: the package's module against the same file at a git revision and against
knob sets, on the same rows in one process; k 2048 (``--k``), rows of standard-normal logits (fp32 or bf16), every
row as wide as the shape, the op's split; the bench's method (rotating copies past L2, the median of CUDA-graph
replays: ``paged_mqa_logits.bench.measure``). The numbers of ``benchmarks/*/topk_sample_ab.csv``.

``python tools/topk_ab.py --baseline REV [--knobs 2048/4,4096/4] [--shapes 64x8192,256x32768] [--dtypes fp32,bf16]``

The revision's ``paged_mqa_logits/top_k/triton_sample.py`` is loaded as a module of its own (its relative imports
made absolute, so it shares the rest of the package as it is now: a change outside that file is on both sides).
Prints CSV: each variant's time, the baseline's time over it, and whether its selection equals ``torch.topk``'s
values as a set. On CPU tensors (``--device cpu``) the kernels run through the interpreter, for the tests: the
times say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from topk_phases import rotating_calls  # noqa: E402  (this folder: the same rows as the phase tool)

from paged_mqa_logits.bench.measure import Schedule, time_calls  # noqa: E402
from paged_mqa_logits.bench.topk import selection_matches  # noqa: E402
from paged_mqa_logits.top_k import triton_sample  # noqa: E402

HEADER = "rows,width,dtype,variant,us,baseline_over_variant,exact"
MODULE = "paged_mqa_logits/top_k/triton_sample.py"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_revision(revision: str, directory: str):
    """``triton_sample`` as it stood at ``revision``, imported from a copy in ``directory`` (kept while it runs:
    Triton reads a kernel's source from its file)."""
    shown = subprocess.run(["git", "-C", ROOT, "show", f"{revision}:{MODULE}"], capture_output=True, text=True,
                           check=False)
    if shown.returncode != 0:
        raise SystemExit(f"--baseline: no {MODULE} at revision {revision!r}: {shown.stderr.strip()}")
    source = re.sub(r"^from \.\.", "from paged_mqa_logits.", shown.stdout, flags=re.MULTILINE)
    source = re.sub(r"^from \.", "from paged_mqa_logits.top_k.", source, flags=re.MULTILINE)
    path = os.path.join(directory, "triton_sample_baseline.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("triton_sample_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pairs(text: str, sep: str, flag: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in item.split(sep)) for item in text.split(",")] if text else []
    except ValueError:
        pairs = [()]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"{flag}: expected comma-separated A{sep}B integer pairs, got {text!r}")
    return pairs


def shape_rows(baseline, rows: int, width: int, dtype: str, k: int, knob_sets, device, schedule,
               paired: bool = False) -> list[str]:
    """The CSV rows (:data:`HEADER`) of one shape: the baseline, the current module, then each knob set (with
    ``paired``, the baseline at the knob set first, and the knob set's ratio against that)."""
    calls = rotating_calls(rows, width, k, device, DTYPES[dtype])
    variants = [("baseline", baseline, None, True), ("current", triton_sample, None, False)]
    for block, warps in knob_sets:
        knobs = {"BLOCK": block, "num_warps": warps}
        if paired:
            variants.append((f"baseline {block}/{warps}", baseline, knobs, True))
        variants.append((f"{block}/{warps}", triton_sample, knobs, False))
    lines, base = [], None
    for name, module, knobs, is_base in variants:
        us = time_calls([lambda call=call, module=module, knobs=knobs: module.launch(call, knobs) for call in calls],
                        device, schedule).us
        call = calls[0]
        call.out.fill_(-1)
        module.launch(call, knobs)
        exact = selection_matches(call.out, call.logits, call.lengths, k)
        base = us if is_base else base
        lines.append(f"{rows},{width},{dtype},{name},{us:.2f},{base / us:.3f},{exact}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision whose triton_sample.py is the baseline")
    parser.add_argument("--shapes", default="64x8192,256x8192,1024x8192,64x32768,256x32768,1024x32768,"
                        "64x131072,256x131072", help="ROWSxWIDTH, comma-separated")
    parser.add_argument("--dtypes", default="fp32", help="logits dtypes, comma-separated: fp32, bf16")
    parser.add_argument("--knobs", default="", help="BLOCK/num_warps sets of the current module, comma-separated")
    parser.add_argument("--paired", action="store_true",
                        help="time the baseline at each knob set too: each set's ratio is then against the baseline "
                        "at the same knobs (without it, against the baseline at its defaults)")
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--replays", type=int, default=None, help="graph replays (GPU) or loops (CPU) per timing")
    a = parser.parse_args(argv)
    shapes, knob_sets = _pairs(a.shapes, "x", "--shapes"), _pairs(a.knobs, "/", "--knobs")
    dtypes = a.dtypes.split(",")
    if not shapes or any(d not in DTYPES for d in dtypes):
        raise SystemExit(f"--shapes and --dtypes ({', '.join(DTYPES)}): got {a.shapes!r} and {a.dtypes!r}")
    device = torch.device(a.device)
    schedule = Schedule(replays=a.replays or (10 if device.type == "cuda" else 1))
    with tempfile.TemporaryDirectory() as directory:
        baseline = load_revision(a.baseline, directory)
        print(HEADER, flush=True)
        for dtype in dtypes:
            for rows, width in shapes:
                print("\n".join(shape_rows(baseline, rows, width, dtype, a.k, knob_sets, device, schedule,
                                                 a.paired)), flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
