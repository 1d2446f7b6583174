"""The CSV (environment header, one row per measurement) and the summary lines: same-run
ratios against DeepGEMM per length mode, bandwidth floors, next_n 3 against its neighbours;
ratios against an anchor file of another run are labelled cross-run."""

from __future__ import annotations

import csv
import math
import os
import tempfile

from .deepgemm import deepgemm_flattens
from .environment import Environment
from .measure import Measurement, format_knobs
from .shapes import Shape


def load_anchor(path: str | None) -> dict[tuple, float]:
    """DeepGEMM timings from a file of another run (``--anchor``), keyed by ``(H, D,
    kv_block_size, next_n, batch, context)``. Ratios against it are *cross-run* and labelled
    so: a same-run ``--deepgemm`` measurement is what counts."""
    if not path:
        return {}
    if not os.path.exists(path):
        raise FileNotFoundError(f"--anchor: no such file: {path}")
    with open(path, newline="") as f:
        return {(int(r["H"]), int(r["D"]), int(r["block_kv"]), int(r["next_n"]), int(r["batch"]), int(r["context"])):
                float(r["us"]) for r in csv.DictReader(line for line in f if not line.startswith("#"))}


def anchor_us(anchor: dict, shape: Shape) -> float | None:
    """The anchor applies to the shapes it was measured on: plain cache, 2-D, uniform lengths, fp8
    inputs, fp32 logits."""
    key = shape.shape_key
    if key.preshuffle or not shape.lens_2d or shape.ragged or key.format_note():
        return None
    return anchor.get((key.heads, key.head_dim, key.kv_block_size, key.next_n, key.batch, shape.context))


COLUMNS = ["impl", "backend", "knobs", "H", "D", "kv_block_size", "preshuffle", "kv_format", "logits_dtype", "lens_2d",
           "ragged", "next_n", "batch",
           "context", "us", "GBps", "frac_of_copy_bw", "TFLOPs", "calc_diff", "mask_ok", "rotate", "calls", "spread",
           "timing", "deepgemm_us", "speedup_vs_deepgemm", "anchor_us_cross_run", "speedup_vs_anchor_cross_run",
           "status"]


def fmt(value, decimals=3) -> str:
    """Fixed decimals, trailing zeros dropped; three significant digits for small values."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -decimals * 100:
            return f"{value:.3g}"
        text = f"{value:.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


def csv_row(m: Measurement, anchor: dict, deepgemm: dict[Shape, float]) -> dict:
    s = m.shape
    key = s.shape_key
    a_us = anchor_us(anchor, s)
    d_us = deepgemm.get(s) if m.impl.kind != "deepgemm" else None
    return {
        "impl": m.impl.kind, "backend": m.backend or "", "knobs": format_knobs(m.knobs), "H": key.heads,
        "D": key.head_dim, "kv_block_size": key.kv_block_size, "preshuffle": int(key.preshuffle),
        "kv_format": key.kv_format, "logits_dtype": key.logits_dtype, "lens_2d": int(s.lens_2d),
        "ragged": s.ragged or "0", "next_n": key.next_n, "batch": key.batch, "context": s.context,
        "us": fmt(m.us, 2), "GBps": fmt(m.gbps, 0), "frac_of_copy_bw": fmt(m.frac_of_copy_bw, 3),
        "TFLOPs": fmt(m.tflops, 1), "calc_diff": f"{m.calc_diff:.2e}" if m.calc_diff is not None else "",
        "mask_ok": "n/a" if m.mask_ok is None and m.calc_diff is not None else fmt(m.mask_ok),
        "rotate": m.rotate, "calls": m.calls, "spread": fmt(m.spread, 3), "timing": m.timing,
        "deepgemm_us": fmt(d_us, 2), "speedup_vs_deepgemm": fmt(d_us / m.us, 3) if d_us and m.us else "",
        "anchor_us_cross_run": fmt(a_us, 2),
        "speedup_vs_anchor_cross_run": fmt(a_us / m.us, 3) if a_us and m.us else "",
        "status": m.status,
    }


def write_csv(path: str, env: Environment, measurements: list[Measurement], *, command: str | None = None,
              anchor: dict | None = None) -> None:
    anchor = anchor or {}
    deepgemm = {m.shape: m.us for m in measurements if m.impl.kind == "deepgemm" and m.us}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bench-", suffix=".csv", dir=folder)  # no predictable name
    try:
        with os.fdopen(fd, "w", newline="") as f:
            for line in env.header_lines(command):
                f.write(line + "\n")
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            for m in measurements:
                writer.writerow(csv_row(m, anchor, deepgemm))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # readers never see a half-written CSV
    except BaseException:
        os.unlink(tmp)
        raise


def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _memory_bound(shape: Shape) -> bool:
    return shape.shape_key.next_n <= 2 and shape.shape_key.batch * shape.context >= 1 << 20


def summary(measurements: list[Measurement], anchor: dict | None = None) -> list[str]:
    """Per length mode (uniform / ragged) and implementation: the same-run comparison with
    DeepGEMM (geomean, worst shape, shapes below 0.90x; flattened DeepGEMM separately), the
    minimum fraction of copy bandwidth on memory-bound shapes (next_n <= 2, batch x context
    >= 1M tokens), the peak TFLOP/s at next_n 4 / H 64, and next_n 3 against the mean of
    next_n 2 and 4 at the same shape. A ratio against ``anchor`` (another run) is labelled
    cross-run."""
    lines = []
    for mode in sorted({m.shape.ragged for m in measurements}):
        grid = [m for m in measurements if m.shape.ragged == mode]
        name = {"": "uniform", "half": "ragged [C/2, C]", "wide": "wide ragged [1, C]"}[mode]
        deepgemm = {m.shape: m.us for m in grid if m.impl.kind == "deepgemm" and m.us}
        for label in sorted({m.impl.label for m in grid if m.impl.kind != "deepgemm"}):
            ms = [m for m in grid if m.impl.label == label and m.us]
            if not ms:
                continue
            text = f"{label} [{name}]: {len(ms)} shapes"
            native = [(deepgemm[m.shape] / m.us, m.shape) for m in ms
                      if m.shape in deepgemm and not deepgemm_flattens(m.shape)]
            if native:
                worst = min(native, key=lambda r: r[0])
                text += (f"; vs DeepGEMM (same run) geomean {geomean(r for r, _ in native):.3f}x over {len(native)}"
                         f" shapes, worst {worst[0]:.3f}x ({worst[1].describe()}),"
                         f" {sum(r < 0.9 for r, _ in native)} below 0.90x")
            flat = [deepgemm[m.shape] / m.us for m in ms if m.shape in deepgemm and deepgemm_flattens(m.shape)]
            if flat:
                text += f"; vs flattened DeepGEMM geomean {geomean(flat):.3f}x over {len(flat)} shapes"
            bw = [m.frac_of_copy_bw for m in ms if _memory_bound(m.shape) and m.frac_of_copy_bw]
            if bw:
                text += f"; min frac of copy bw (next_n<=2, B*ctx>=1M) {min(bw):.3f}"
            flops = [m.tflops for m in ms
                     if m.shape.shape_key.next_n == 4 and m.shape.shape_key.heads == 64 and m.tflops]
            if flops:
                text += f"; max TFLOP/s (next_n=4, H=64) {max(flops):.0f}"
            by_key = {(m.shape.shape_key.heads, m.shape.shape_key.batch, m.shape.context,
                       m.shape.shape_key.next_n): m.us for m in ms}
            n3 = [(by_key[(h, b, c, 3)] / ((by_key[(h, b, c, 2)] + by_key[(h, b, c, 4)]) / 2), (h, b, c))
                  for (h, b, c, n) in by_key if n == 3 and (h, b, c, 2) in by_key and (h, b, c, 4) in by_key]
            if n3:
                worst = max(n3)
                text += (f"; next_n 3 / mean(next_n 2, 4): worst {worst[0]:.3f} (H={worst[1][0]} batch={worst[1][1]}"
                         f" context={worst[1][2]}), {sum(r > 1 for r, _ in n3)} of {len(n3)} above 1")
            ratios = [anchor_us(anchor, m.shape) / m.us for m in ms if anchor and anchor_us(anchor, m.shape)]
            if ratios:
                text += f"; vs the anchor file (cross-run) {geomean(ratios):.3f}x over {len(ratios)} shapes"
            lines.append(text)
        dispatch = {m.shape: m.us for m in grid if m.impl.kind == "dispatch" and m.us}
        for label in sorted({m.impl.label for m in grid if m.impl.kind == "backend"}):
            other = {m.shape: m.us for m in grid if m.impl.label == label and m.us}
            shared = [s for s in other if s in dispatch]
            if shared:
                ratio = geomean(other[s] / dispatch[s] for s in shared)
                lines.append(f"dispatch vs {label} [{name}]: {ratio:.3f}x faster (geomean over {len(shared)} shapes)")
    return lines

def print_table(results: list[Measurement], anchor: dict, file=None) -> None:
    deepgemm = {m.shape: m.us for m in results if m.impl.kind == "deepgemm" and m.us}
    cols = ["impl", "backend", "knobs", "H", "next_n", "batch", "context", "ragged", "us", "GBps",
            "frac_of_copy_bw", "TFLOPs", "calc_diff", "speedup_vs_deepgemm", "status"]
    rows = [cols] + [[str(csv_row(m, anchor, deepgemm)[c]) for c in cols] for m in results]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip(), file=file)
