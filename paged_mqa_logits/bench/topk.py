"""``python -m paged_mqa_logits bench --topk``: the top-k backends against ``torch.topk`` (and, with
``--vllm DIR`` and ``--flashinfer DIR``, vLLM's and FlashInfer's staged kernels) on the same logits
rows, with the logits bench's method: rotating copies of the rows past L2, warm-up outside capture,
the median of CUDA-graph replays divided by the calls in the graph, the copy bandwidth measured in
the same run, a CSV with the device and versions.

Bytes = the visible logits each row holds (4 per position) + the selection written (4 per slot);
every implementation is charged the same bytes, so GB/s compare as times do. ``torch.topk`` runs
as DeepSeek's reference code runs it: over whole rows (cleaned logits), ``sorted=False``. Every
implementation but ``torch.topk`` is checked on the first copy: the values it selects equal
``torch.topk``'s over each visible prefix, as multisets, with the same number of ``-1``."""

from __future__ import annotations

import csv
import functools
import importlib
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..cli import ArgumentParser
from ..files import atomic_write
from ..top_k import BACKENDS, topk
from ..top_k.torch_ref import visible_lengths
from .environment import environment, l2_bytes
from .measure import Schedule, time_calls
from .report import fmt
from .shapes import int_list
from .workload import MIN_WORKING_SET

LENGTHS = ("uniform", "wide")
GPU_DEFAULTS = {"batch": "64,256,1024", "next_n": "1,2", "context": "8192,32768,131072", "k": "2048"}
CPU_DEFAULTS = {"batch": "2", "next_n": "2", "context": "512", "k": "16"}
COLUMNS = ["impl", "batch", "next_n", "rows", "context", "lengths", "k", "us", "GBps", "frac_of_copy_bw",
           "speedup_vs_torch_topk", "rotate", "calls", "timing", "status"]
#: the rows vLLM's persistent_topk keeps state for (its workspace is one buffer of at least 1 MiB)
PERSISTENT_WORKSPACE_BYTES = 64 << 20


@dataclass(frozen=True)
class RowShape:
    batch: int
    next_n: int
    context: int
    lengths: str  # "uniform" (every sequence `context` long) or "wide" (uniform in [1, context])
    k: int

    @property
    def rows(self) -> int:
        return self.batch * self.next_n


def sequence_lengths(shape: RowShape, generator: torch.Generator) -> torch.Tensor:
    """int32 ``[batch]``: ``context`` each, or uniform in ``[1, context]`` with the first exactly ``context``."""
    if shape.lengths == "uniform":
        return torch.full((shape.batch,), shape.context, dtype=torch.int32)
    lens = torch.randint(1, shape.context + 1, (shape.batch,), generator=generator, dtype=torch.int32)
    lens[0] = shape.context
    return lens


def useful_bytes(shape: RowShape, lens: torch.Tensor) -> int:
    """Visible logits read (4 bytes each) + the selection written (4 bytes a slot)."""
    visible = int(visible_lengths(lens, shape.next_n, shape.context).sum())
    return 4 * visible + 4 * shape.rows * shape.k


def copies_for(shape: RowShape, device: torch.device, max_copies: int) -> int:
    """Rotating copies whose rows together pass ``max(4 x L2, MIN_WORKING_SET)``, as the logits bench."""
    if device.type != "cuda":
        return 2
    one = 4 * shape.rows * shape.context
    want = math.ceil(max(4 * l2_bytes(device), MIN_WORKING_SET) / one)
    free = torch.cuda.mem_get_info(device)[0]
    return max(2, min(want, max_copies, int(0.5 * free // max(one, 1))))


def staged_provenance(path: str, peer: str) -> str | None:
    """The CSV header line naming the ``peer`` (vllm, flashinfer) a ``--vllm``/``--flashinfer``
    folder was staged from (its ``manifest.json``, ``tools/stage_<peer>_topk.sh``); None when the
    folder has no manifest."""
    try:
        with open(os.path.join(path, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    version = manifest.get("version") or "version not recorded"
    return (f"# {peer}: {version} (revision {str(manifest.get('revision', '?'))[:12]}, staged by "
            f"tools/stage_{peer}_topk.sh and built on this machine)")


def _import_built(path: str, module: str):
    """The module a staged folder's ``build.py`` built under ``path/build``."""
    sys.path.insert(0, f"{path}/build")
    return importlib.import_module(module)


def load_vllm(path: str):
    """The module ``tools/vllm_topk/build.py`` built under ``path`` (``vllm_topk_staged``)."""
    return _import_built(path, "vllm_topk_staged")


def load_flashinfer(path: str):
    """The ctypes module ``tools/flashinfer_topk/build.py`` built under ``path`` (``flashinfer_topk_staged``;
    it only imports once its library is built)."""
    return _import_built(path, "flashinfer_topk_staged")


def load_peer(option: str, path: str | None, loader, peer: str):
    """``loader(path)`` for a ``--vllm``/``--flashinfer`` folder, or None (no folder, or one that does not
    import: a note says so, and the other implementations still run)."""
    if not path:
        return None
    try:
        return loader(path)
    except Exception as exc:  # noqa: BLE001 (whatever stops the import)
        print(f"note: --{option} {path}: not importable ({type(exc).__name__}: {exc}); {peer} not timed",
              file=sys.stderr)
        return None


def implementations(shape: RowShape, names: list[str], vllm, flashinfer=None) -> dict[str, Callable]:
    """label -> ``call(logits, lens, rows_lens, out)`` (rows_lens: int32 visible length per row)."""
    k, next_n = shape.k, shape.next_n
    calls: dict[str, Callable] = {
        "torch.topk": lambda x, lens, row_lens, out: torch.topk(x, min(k, x.shape[1]), dim=1, sorted=False)}

    def ours(x, lens, row_lens, out, backend):
        return topk(x, lens, k, next_n=next_n, out=out, backend=backend)

    for name in names:
        calls[f"topk:{name}"] = functools.partial(ours, backend=name)
    if vllm is not None:
        calls["vllm:top_k_per_row_decode"] = lambda x, lens, row_lens, out: vllm.top_k_per_row_decode(
            x, next_n, lens, out, x.shape[0], x.stride(0), x.stride(1), k)
        if hasattr(vllm, "persistent_topk"):
            workspace = {}
            # later vLLM takes the longest row too (an upper bound: it picks the launch shape
            # and lets CTAs past it exit); the row width is one, known without a device sync
            takes_max_len = "max_seq_len" in getattr(vllm, "signatures", {}).get("persistent_topk", ())

            def persistent(x, lens, row_lens, out):
                if x.device not in workspace:
                    workspace[x.device] = torch.empty(PERSISTENT_WORKSPACE_BYTES, dtype=torch.uint8, device=x.device)
                extra = (x.shape[1],) if takes_max_len else ()
                vllm.persistent_topk(x, row_lens, out, workspace[x.device], k, *extra)
            calls["vllm:persistent_topk"] = persistent
    if flashinfer is not None:
        # FlashInfer's ragged transform with zero offsets: each row's visible length, positions out
        calls["flashinfer:top_k_ragged_transform"] = lambda x, lens, row_lens, out: (
            flashinfer.top_k_ragged_transform(x, row_lens, out, k))
    return calls


def selection_matches(out: torch.Tensor, logits: torch.Tensor, row_lens: torch.Tensor, k: int) -> bool:
    """Exact as a set: each row's positions are distinct and visible, the values at them are
    torch.topk's over the visible prefix (multisets), with as many ``-1`` as the row lacks
    positions; checked on the device, one result read back."""
    columns = torch.arange(logits.shape[1], device=logits.device)
    masked = torch.where(columns[None, :] < row_lens[:, None].long(), logits, float("-inf"))
    take = min(k, logits.shape[1])
    expected = torch.topk(masked, take, dim=1).values
    want = row_lens.long().clamp_max(k)
    slot = torch.arange(take, device=logits.device)[None, :]
    expected = torch.where(slot < want[:, None], expected, float("-inf")).sort(dim=1).values
    live = out[:, :take] >= 0
    got = torch.where(live, logits.gather(1, out[:, :take].long().clamp_min(0)), float("-inf")).sort(dim=1).values
    counts_ok = torch.equal(live.sum(1), want) and bool((out[:, take:] == -1).all())
    visible = bool(((out[:, :take] < row_lens[:, None]) | ~live).all())
    ordered = torch.where(live, out[:, :take].long(), -1 - slot).sort(dim=1).values  # -1s made distinct
    distinct = take < 2 or bool((ordered[:, 1:] != ordered[:, :-1]).all())
    return counts_ok and visible and distinct and torch.equal(got.nan_to_num(), expected.nan_to_num())


def measure_shape(shape: RowShape, names: list[str], vllm, device: torch.device, schedule: Schedule,
                  copy_gbps: float, max_copies: int, seed: int, flashinfer=None) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    lens = sequence_lengths(shape, generator)
    row_lens = visible_lengths(lens, shape.next_n, shape.context).to(torch.int32)
    copies = copies_for(shape, device, max_copies)
    rows = [torch.randn(shape.rows, shape.context, generator=generator).to(device) for _ in range(copies)]
    lens, row_lens = lens.to(device), row_lens.to(device)
    outs = [torch.empty(shape.rows, shape.k, dtype=torch.int32, device=device) for _ in range(copies)]
    nbytes = useful_bytes(shape, lens)
    results = []
    for label, call in implementations(shape, names, vllm, flashinfer).items():
        row = {"impl": label, "batch": shape.batch, "next_n": shape.next_n, "rows": shape.rows,
               "context": shape.context, "lengths": shape.lengths, "k": shape.k, "rotate": copies, "status": "ok"}
        try:
            if label != "torch.topk":
                call(rows[0], lens, row_lens, outs[0])
                if not selection_matches(outs[0], rows[0], row_lens, shape.k):
                    row["status"] = "FAIL: not the exact top-k"
            timing = time_calls([functools.partial(call, rows[i], lens, row_lens, outs[i]) for i in range(copies)],
                                device, schedule)
        except Exception as exc:  # noqa: BLE001 (one implementation failing leaves the others' rows)
            row["status"] = f"ERROR: {type(exc).__name__}: {exc}"[:300]
            results.append(row)
            continue
        gbps = nbytes / timing.us / 1e3
        row.update(us=timing.us, GBps=gbps, frac_of_copy_bw=gbps / copy_gbps if copy_gbps else None,
                   calls=timing.calls, timing=timing.method)
        results.append(row)
    floor = next((r.get("us") for r in results if r["impl"] == "torch.topk"), None)
    for r in results:
        if floor and r.get("us"):
            r["speedup_vs_torch_topk"] = floor / r["us"]
    return results


def write_csv(path: str, header: list[str], rows: list[dict], columns: list[str] = COLUMNS) -> None:
    """``rows`` (dicts; missing cells empty) under the ``#`` lines of ``header``, written all or
    nothing (the bench's CSV files: this one's and ``bench --indexer``'s)."""
    with atomic_write(path, newline="") as f:
        for line in header:
            f.write(line + "\n")
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({c: fmt(r.get(c)) for c in columns})


def int_options(p: ArgumentParser, a, names: tuple[str, ...], defaults: dict) -> dict[str, list[int]]:
    """Each option of ``names`` (attribute names of ``a``) as a list of positive ints, ``defaults``
    where unset; a usage error naming the option otherwise."""
    values = {}
    for name in names:
        text = getattr(a, name) or defaults[name]
        try:
            values[name] = int_list(text)
        except ValueError:
            values[name] = []
        if not values[name] or min(values[name]) < 1:
            p.error(f"argument --{name.replace('_', '-')}: expected comma-separated positive integers, got {text!r}")
    return values


def header_lines(env, command: str, method: str, vllm_dir: str | None = None,
                 flashinfer_dir: str | None = None) -> list[str]:
    """The environment's CSV header (device, versions, copy bandwidth, the command) with the
    ``# method:`` line of the bench that writes it, and the staged vLLM's and FlashInfer's
    (``staged_provenance``) when ``vllm_dir``/``flashinfer_dir`` name them."""
    lines = [line for line in env.header_lines(command) if not line.startswith("# method:")]
    staged = [staged_provenance(d, peer) for d, peer in ((vllm_dir, "vllm"), (flashinfer_dir, "flashinfer")) if d]
    return lines + [line for line in staged if line] + [f"# method: {method}"]


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m paged_mqa_logits bench --topk",
                       description="Time the top-k backends against torch.topk on the same logits rows "
                                   "(docs/TOPK.md); exits non-zero if any selection is not exact.")
    p.add_argument("--batch", default=None, help=f"default {GPU_DEFAULTS['batch']} (CPU: {CPU_DEFAULTS['batch']})")
    p.add_argument("--next-n", default=None, help=f"default {GPU_DEFAULTS['next_n']} (CPU: {CPU_DEFAULTS['next_n']})")
    p.add_argument("--context", default=None,
                   help=f"row widths, default {GPU_DEFAULTS['context']} (CPU: {CPU_DEFAULTS['context']})")
    p.add_argument("--k", default=None, help=f"default {GPU_DEFAULTS['k']} (CPU: {CPU_DEFAULTS['k']})")
    p.add_argument("--lengths", default=",".join(LENGTHS),
                   help="uniform (every sequence the full context) and/or wide (uniform in [1, context])")
    p.add_argument("--backend", default=",".join(BACKENDS), help="top-k backends to time")
    p.add_argument("--vllm", default=None, help="a folder staged by tools/stage_vllm_topk.sh and built there")
    p.add_argument("--flashinfer", default=None,
                   help="a folder staged by tools/stage_flashinfer_topk.sh and built there")
    p.add_argument("--device", default=None)
    p.add_argument("--replays", type=int, default=None, help="graph replays per measurement (default GPU 10, CPU 2)")
    p.add_argument("--max-copies", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="CSV to write")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    a = p.parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    defaults = CPU_DEFAULTS if device.type == "cpu" else GPU_DEFAULTS
    values = int_options(p, a, ("batch", "next_n", "context", "k"), defaults)
    modes = a.lengths.split(",")
    if any(m not in LENGTHS for m in modes):
        p.error(f"argument --lengths: expected a comma-separated subset of {', '.join(LENGTHS)}, got {a.lengths!r}")
    names = a.backend.split(",")
    if any(n not in BACKENDS for n in names):
        p.error(f"argument --backend: expected names among {', '.join(BACKENDS)}, got {a.backend!r}")
    vllm = load_peer("vllm", a.vllm, load_vllm, "vLLM")
    flashinfer = load_peer("flashinfer", a.flashinfer, load_flashinfer, "FlashInfer")
    shapes = [RowShape(b, n, c, m, k) for k in values["k"] for c in values["context"] for n in values["next_n"]
              for b in values["batch"] for m in modes]
    env = environment(device)
    command = "python -m paged_mqa_logits bench --topk " + " ".join(argv)
    header = header_lines(env, command, "docs/TOPK.md -- rotating copies of the rows past L2, median of "
                                        "CUDA-graph replays / calls; bytes = visible logits (4 each) + selection "
                                        "written (4 a slot)", a.vllm if vllm is not None else None,
                          a.flashinfer if flashinfer is not None else None)
    for line in header:
        print(line)
    schedule = Schedule(replays=a.replays or (10 if device.type == "cuda" else 2))
    results: list[dict] = []
    for shape in shapes:
        results.extend(measure_shape(shape, names, vllm, device, schedule, env.copy_gbps, a.max_copies, a.seed,
                                     flashinfer))
        if a.out:
            write_csv(a.out, header, results)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(",".join(COLUMNS))
    for r in results:
        print(",".join(fmt(r.get(c)) for c in COLUMNS))
    return 1 if any(r["status"] != "ok" for r in results) else 0
