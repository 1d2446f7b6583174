"""Where ``triton_sample`` spends its time: the seed alone, the seed and the compaction, the whole kernel, and
``triton_radix`` beside it, each one program a row (``split`` 1), on rows of standard-normal fp32 logits with the
bench's method (rotating copies past L2, the median of CUDA-graph replays: ``paged_mqa_logits.bench.measure``);
also the lengths of the lists the seed leaves. The numbers of docs/PERF_NOTES.md, "Top-k".

``python tools/topk_phases.py [--shapes 64x8192,256x32768] [--knobs 8192/8,4096/4] [--k 2048]``

The finish's time is the whole kernel's less the seed's and the compaction's (``triton_sample.launch`` with
``stop_after``). Rows no longer than ``triton_sample.held_row_for`` are selected whole in registers: their
seed and compaction times are the chunk kernel's launch alone, and the list columns say ``held``. A diagnostic,
not the benchmark: its rows are uniform and its ``split`` fixed, where
``bench --topk`` times each backend as the op would run it. On CPU tensors (``--device cpu``) it runs the
kernels through the interpreter, for the tests: its times there say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from paged_mqa_logits.bench.measure import Schedule, time_calls  # noqa: E402
from paged_mqa_logits.top_k import triton_radix, triton_sample  # noqa: E402
from paged_mqa_logits.top_k.validate import check_call  # noqa: E402

HEADER = ("rows,width,k,BLOCK,num_warps,seed_us,compaction_us,finish_us,whole_us,radix_us,"
          "list_min,list_median,list_max,below_k")
#: at most this many bytes of rotating copies (past the L2 of the GPUs this project tunes for)
COPY_BYTES = 256 << 20


def _pairs(text: str, sep: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in item.split(sep)) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"expected comma-separated A{sep}B integer pairs, got {text!r}")
    return pairs


def rotating_calls(rows: int, width: int, k: int, device: torch.device, dtype: torch.dtype = torch.float32) -> list:
    """Validated top-k calls over rotating copies (at most :data:`COPY_BYTES` of fp32 rows, 2-32 copies on a GPU,
    one on CPU) of ``rows`` rows of ``width`` standard-normal logits, every position visible, seeded by the shape;
    also ``tools/topk_ab.py``'s rows."""
    copies = max(2, min(32, COPY_BYTES // (rows * width * 4))) if device.type == "cuda" else 1
    generator = torch.Generator(device=device).manual_seed(rows * 31 + width)
    lengths = torch.full((rows,), width, dtype=torch.int32, device=device)
    return [check_call(torch.randn(rows, width, device=device, generator=generator).to(dtype), lengths, 1, k,
                       torch.empty(rows, k, dtype=torch.int32, device=device)) for _ in range(copies)]


def phase_row(rows: int, width: int, k: int, block: int, warps: int, device: torch.device,
              schedule: Schedule) -> str:
    """One CSV row (:data:`HEADER`) for ``rows`` rows of ``width`` visible logits."""
    calls = rotating_calls(rows, width, k, device)
    knobs = {"BLOCK": block, "num_warps": warps}

    def timed(run) -> float:
        return time_calls([lambda call=call: run(call) for call in calls], device, schedule).us

    seed = timed(lambda call: triton_sample.launch(call, knobs, split=1, stop_after="seed"))
    compacted = timed(lambda call: triton_sample.launch(call, knobs, split=1, stop_after="compaction"))
    whole = timed(lambda call: triton_sample.launch(call, knobs, split=1))
    radix = timed(lambda call: triton_radix.launch(call, None, split=1))
    _, counts = triton_sample.launch(calls[0], knobs, split=1, stop_after="compaction")
    counts = counts.flatten().float()
    if width > k and int(counts.max()) == 0:  # rows held whole (triton_sample.HELD_ROW): no seed, no list
        lists = "held,held,held,-"
    else:
        below = (counts < min(k, width)).float().mean().item()
        lists = f"{int(counts.min())},{int(counts.median())},{int(counts.max())},{below:.3f}"
    return (f"{rows},{width},{k},{block},{warps},{seed:.2f},{compacted - seed:.2f},{whole - compacted:.2f},"
            f"{whole:.2f},{radix:.2f},{lists}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="64x8192,256x8192,1024x8192,64x32768,256x32768,256x131072",
                        help="ROWSxWIDTH, comma-separated")
    parser.add_argument("--knobs", default="8192/8,4096/4", help="BLOCK/num_warps of triton_sample, comma-separated")
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--replays", type=int, default=None, help="graph replays (GPU) or loops (CPU) per timing")
    a = parser.parse_args(argv)
    device = torch.device(a.device)
    schedule = Schedule(replays=a.replays or (10 if device.type == "cuda" else 1))
    print(HEADER, flush=True)
    for rows, width in _pairs(a.shapes, "x"):
        for block, warps in _pairs(a.knobs, "/"):
            print(phase_row(rows, width, a.k, block, warps, device, schedule), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
