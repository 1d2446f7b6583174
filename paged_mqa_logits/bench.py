"""The measuring method (docs/BENCHMARK.md), shared by ``python -m paged_mqa_logits bench`` and
the tuner (``python -m tuner``).

Method, for one shape:

* **Honest footprint.** Every rotating copy of the inputs comes from its own
  :func:`~paged_mqa_logits.reference.make_inputs` call (a distinct block for every token, the
  block table filled from a random permutation). On a GPU there are enough copies that the
  working set (KV bytes + logits of all copies) is at least ``max(4 x L2, 512 MiB)``, between
  2 and ``max_copies`` copies, and never more than device memory allows. Calls cycle over the
  copies, so no call finds the previous call's data in L2.
* **Time what serving does.** One warm-up pass outside any capture (JIT compilation happens
  here), one eager pass to size the graph, then a CUDA graph of ``passes x copies`` calls is
  captured and replayed; the reported time is the median over replays divided by the calls in
  the graph. A call that cannot be captured is timed eagerly and marked ``FAIL`` (the op must be
  capturable). On CPU a plain wall-clock loop over the same calls. The device-to-device copy
  bandwidth is measured in the same run.
* **Realistic batches.** Besides uniform contexts, ``--ragged`` draws per-sequence lengths from
  ``[C/2, C]`` and ``--wide-ragged`` from ``[1, C]`` (seeded; the first sequence is exactly
  ``C``), the spread of a serving decode batch. Every implementation sees the same lengths.
* **Accounting.** Bytes = KV bytes of the tokens each sequence walks (keys + fp32 scales,
  ``D + 4`` per token) + logits written (4 per visible position); FLOPs = ``2 * H * D`` per
  visible (row, key) pair, i.e. ``2*H*D*next_n`` per key. Block-table, query and weight bytes
  are left out (DeepGEMM's own benchmark counts the same way).
* **Accuracy on every shape.** The first copy's output is pre-filled with a signalling-NaN
  sentinel, one call is made, and :func:`~paged_mqa_logits.reference.check_logits` checks the
  untouched/mask contract exactly (bit for bit) and ``calc_diff < 1e-3`` on valid positions.

What can be timed (:class:`Impl`): a backend with given knobs, the production dispatch
(``launch(args)``: table lookup and fallback chain, as the op runs it), and DeepGEMM's
``fp8_paged_mqa_logits`` when the ``deep_gemm`` package is importable (:func:`deepgemm_runner`),
on the same inputs in the same run. Where DeepGEMM refuses a next_n (anything but 1, 2, 4),
it is timed the way vLLM runs such calls on sm_90: flattened into ``B*next_n`` requests of
next_n 1 (backend ``deepgemm-flat``), which reads every KV page next_n times.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from .problem import HEAD_DIM, LaunchArgs

SENTINEL_BITS = 0x7FBADBAD  # a signalling-NaN payload no kernel computes: "never written"
MIN_WORKING_SET = 512 << 20
DEFAULT_GRID = dict(heads=(32, 64), next_n=(1, 2, 3, 4), batch=(1, 8, 32, 64, 128, 256), context=(8192, 32768),
                    kv_block_size=(64,))
#: per-sequence length modes: every sequence at ``context``; drawn from ``[C/2, C]``; from ``[1, C]``
LENGTH_MODES = ("", "half", "wide")
#: next_n values DeepGEMM's kernel serves directly; others are timed flattened (see above)
DEEPGEMM_NEXT_N = (1, 2, 4)


# ----------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    """One benchmarked problem: uniform context by default; ``ragged="half"`` draws per-sequence
    lengths from ``[context/2, context]``, ``ragged="wide"`` from ``[1, context]`` (seeded, the
    first one exactly ``context``; ``True`` means ``"half"``)."""

    heads: int
    next_n: int
    batch: int
    context: int
    kv_block_size: int = 64
    preshuffle: bool = False
    head_dim: int = HEAD_DIM
    lens_2d: bool = True
    ragged: str = ""

    def __post_init__(self):
        mode = {True: "half", False: ""}.get(self.ragged, self.ragged)
        if mode not in LENGTH_MODES:
            raise ValueError(f"Shape.ragged must be one of {LENGTH_MODES} (or a bool), got {self.ragged!r}")
        object.__setattr__(self, "ragged", mode)

    def lens(self, seed: int = 0) -> list[int]:
        if not self.ragged:
            return [self.context] * self.batch
        gen = torch.Generator().manual_seed(seed)
        low = self.context // 2 if self.ragged == "half" else 1
        lens = torch.randint(low, self.context + 1, (self.batch,), generator=gen).tolist()
        lens[0] = self.context
        return lens

    def describe(self) -> str:
        return (f"H={self.heads} next_n={self.next_n} batch={self.batch} context={self.context} "
                f"kv_block_size={self.kv_block_size} preshuffle={int(self.preshuffle)}"
                + ("" if self.lens_2d else " lens=1d") + (f" ragged={self.ragged}" if self.ragged else ""))


def grid_shapes(heads, next_n, batch, context, kv_block_size=(64,), preshuffle=(False,), *, lens_2d=True,
                ragged="", head_dim=HEAD_DIM) -> list[Shape]:
    return [Shape(h, n, b, c, bs, p, head_dim, lens_2d, ragged)
            for h, n, bs, p, c, b in itertools.product(heads, next_n, kv_block_size, preshuffle, context, batch)]


def _int_list(text) -> list[int]:
    return [int(x) for x in str(text).replace(";", " ").replace("|", " ").replace(",", " ").split()]


def shapes_from_csv(path: str, *, contexts=None, lens_2d=True, ragged="") -> list[Shape]:
    """Shapes from a CSV with columns ``heads``/``H``, ``next_n``, ``batch`` and ``context`` (or
    ``contexts``, a ``;``-separated list, as in the tuner's untuned files), optionally
    ``kv_block_size``, ``preshuffle``, ``head_dim``. ``contexts`` (a list) overrides the file's."""
    shapes = []
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if line.strip() and not line.lstrip().startswith("#"))
        for row in rows:
            row = {k.strip(): (v or "").strip() for k, v in row.items()}
            ctx = contexts or _int_list(row.get("contexts") or row.get("context") or "")
            if not ctx:
                raise ValueError(f"{path}: row {row} has no context (give --context)")
            for c in ctx:
                shapes.append(Shape(
                    heads=int(row.get("heads") or row["H"]), next_n=int(row["next_n"]), batch=int(row["batch"]),
                    context=c, kv_block_size=int(row.get("kv_block_size") or 64),
                    preshuffle=(row.get("preshuffle") or "0").lower() in ("1", "true"),
                    head_dim=int(row.get("head_dim") or HEAD_DIM), lens_2d=lens_2d, ragged=ragged))
    return shapes


# ----------------------------------------------------------------------------- environment
@dataclass
class Environment:
    device: str
    gpu: str
    arch: str
    cu_num: int
    l2_bytes: int
    triton: str
    torch: str
    cuda: str
    date: str
    copy_gbps: float

    def header_lines(self, command: str | None = None) -> list[str]:
        lines = [
            f"# gpu: {self.gpu}",
            f"# arch: {self.arch}, {'SMs' if self.arch.startswith('sm_') else 'CUs'}: {self.cu_num}, "
            f"L2: {self.l2_bytes / 2**20:.0f} MiB",
            f"# versions: triton {self.triton}, torch {self.torch}, {self.cuda}",
            f"# date: {self.date}",
            f"# copy_bandwidth_GBps: {self.copy_gbps:.0f} (device-to-device copy, read + write, same run)",
            "# method: docs/BENCHMARK.md -- rotating make_inputs copies past L2, warm-up outside capture, "
            "median of CUDA-graph replays / calls; bytes = KV (D+4 per walked token) + logits written",
        ]
        if command:
            lines.append(f"# command: {command}")
        return lines


def _versions() -> tuple[str, str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # triton is a dependency, but the bench must still describe a broken install
        triton_version = "none"
    if torch.version.hip:
        accel = f"hip {torch.version.hip}"
    elif torch.version.cuda:
        accel = f"cuda {torch.version.cuda}"
    else:
        accel = "cpu build"
    return triton_version, torch.__version__, accel


def copy_bandwidth(device: str | torch.device, nbytes: int | None = None, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written, median of repeats)."""
    dev = torch.device(device)
    nbytes = nbytes or ((1 << 30) if dev.type == "cuda" else (64 << 20))
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.fill_(1)
    dst = torch.empty_like(src)
    # Warm up long enough for an idle GPU to reach its clocks: a single copy measured right
    # after idling reads ~10% low (3.7 vs 4.2 TB/s seen on the H200).
    for _ in range(10 if dev.type == "cuda" else 1):
        dst.copy_(src)
    seconds = []
    for _ in range(repeats):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds.append(time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / statistics.median(seconds) / 1e9


def environment(device: str | torch.device) -> Environment:
    from .arch import detect

    dev = torch.device(device)
    info = detect(dev)
    triton_version, torch_version, accel = _versions()
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        gpu, l2 = props.name, int(getattr(props, "L2_cache_size", 0) or 50 << 20)
    else:
        gpu, l2 = "cpu", 0
    return Environment(
        device=str(dev), gpu=gpu, arch=info.arch, cu_num=info.cu_num, l2_bytes=l2, triton=triton_version,
        torch=torch_version, cuda=accel, date=datetime.date.today().isoformat(), copy_gbps=copy_bandwidth(dev),
    )


# ----------------------------------------------------------------------------- workload
@dataclass
class Accounting:
    """What one call must do, from the host-side lengths (never read from the device)."""

    visible: int  # (row, key) pairs written
    kv_bytes: int  # keys + scales of the tokens every sequence walks
    logits_bytes: int

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.logits_bytes

    def flops(self, heads: int, head_dim: int) -> int:
        return 2 * heads * head_dim * self.visible


def accounting(shape: Shape, lens: list[int], max_model_len: int, max_blocks: int) -> Accounting:
    """Row ``(b, j)`` sees ``min(max(L_b - next_n + j + 1, 0), max_model_len, max_blocks*bs)``
    positions (problem.py); sequence ``b`` walks the longest of its rows."""
    width = min(max_model_len, max_blocks * shape.kv_block_size)
    visible = walked = 0
    for length in lens:
        rows = [min(max(length - shape.next_n + j + 1, 0), width) for j in range(shape.next_n)]
        visible += sum(rows)
        walked += max(rows)
    return Accounting(visible, walked * (shape.head_dim + 4), visible * 4)


def _fp8_dtype(arch: str) -> torch.dtype:
    return torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn


def _copy_footprint(shape: Shape, lens: list[int]) -> tuple[int, int]:
    """``(persistent bytes of one copy, transient peak while building one)``.
    make_inputs draws float32 keys and quantises them out of place: ~16 bytes per key element."""
    blocks = sum(math.ceil(n / shape.kv_block_size) for n in lens)
    key_elems = blocks * shape.kv_block_size * shape.head_dim
    persistent = blocks * shape.kv_block_size * (shape.head_dim + 4) + shape.batch * shape.next_n * (max(lens) + 8) * 4
    return persistent, 16 * key_elems


@dataclass
class Workload:
    """Rotating input copies of one shape on one device, with their validated launch arguments."""

    shape: Shape
    device: torch.device
    inputs: list[dict]
    args: list[LaunchArgs]
    lens: list[int]
    accounting: Accounting
    context_hint: int | None
    _reference: torch.Tensor | None = field(default=None, repr=False)

    @property
    def copies(self) -> int:
        return len(self.args)

    @property
    def working_set_bytes(self) -> int:
        return self.copies * (self.accounting.bytes)

    def with_hint(self, context_hint: int | None) -> "Workload":
        """The same copies, validated again with another host ``context_hint`` (cheap: no
        tensor is rebuilt; the reference is shared)."""
        from .op import build_launch_args

        if context_hint == self.context_hint:
            return self
        args = [build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                  inp["context_lens"], inp["kv_indices"], inp["max_model_len"],
                                  self.shape.preshuffle, self.shape.kv_block_size, context_hint=context_hint)
                for inp in self.inputs]
        self.reference()
        return Workload(self.shape, self.device, self.inputs, args, self.lens, self.accounting, context_hint,
                        self._reference)

    def reference(self) -> torch.Tensor:
        """Reference logits of copy 0 (``-inf`` where not visible); computed once."""
        if self._reference is None:
            from .reference import logits_into

            inp = self.inputs[0]
            rows = self.shape.batch * self.shape.next_n
            ref = torch.full((rows, inp["max_model_len"]), float("-inf"), dtype=torch.float32, device=self.device)
            # Big column chunks on a GPU: the reference is not what is being timed.
            logits_into(ref, inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                        inp["max_model_len"], kv_block_size=self.shape.kv_block_size, preshuffle=self.shape.preshuffle,
                        max_elements=(1 << 28) if self.device.type == "cuda" else (1 << 25))
            self._reference = ref
        return self._reference


def build_workload(shape: Shape, device: str | torch.device = "cpu", *, copies: int | None = None,
                   max_copies: int = 256, working_set: int | None = None, seed: int = 0,
                   context_hint: int | None | str = "context", arch: str | None = None) -> Workload:
    """Rotating copies of ``shape`` (see the module docstring for how many).

    ``context_hint="context"`` passes the shape's context as the host hint, as engines that know
    the step's longest context do; ``None`` leaves it out (the table's ``any`` rows serve).
    """
    from .arch import detect
    from .op import build_launch_args
    from .reference import make_inputs

    dev = torch.device(device)
    arch = arch or detect(dev).arch
    lens = shape.lens(seed)
    per_copy, transient = _copy_footprint(shape, lens)
    if copies is None:
        if dev.type == "cuda":
            l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 50 << 20)
            target = working_set or max(4 * l2, MIN_WORKING_SET)
            copies = min(max(2, math.ceil(target / max(per_copy, 1))), max_copies)
        else:
            copies = 1  # CPU: the loop is for tests and accounting, not for bandwidth
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        budget = int(0.8 * free) - transient - 3 * per_copy  # room for the reference and the check
        fits = budget // max(per_copy, 1)
        if fits < 1:
            raise MemoryError(f"{shape.describe()}: one copy needs {(per_copy + transient) / 2**30:.1f} GiB "
                              f"while building, {free / 2**30:.1f} GiB free")
        copies = max(1, min(copies, fits))
    hint = shape.context if context_hint == "context" else context_hint
    inputs, args = [], []
    for i in range(copies):
        inp = make_inputs(shape.batch, shape.next_n, shape.heads, lens, kv_block_size=shape.kv_block_size,
                          preshuffle=shape.preshuffle, fp8_dtype=_fp8_dtype(arch), lens_2d=shape.lens_2d,
                          max_model_len=max(lens), device=dev, seed=seed + i, head_dim=shape.head_dim)
        inputs.append(inp)
        args.append(build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"],
                                      inp["context_lens"], inp["kv_indices"], inp["max_model_len"],
                                      shape.preshuffle, shape.kv_block_size, context_hint=hint))
    acc = accounting(shape, lens, inputs[0]["max_model_len"], inputs[0]["kv_indices"].shape[1])
    return Workload(shape, dev, inputs, args, lens, acc, hint)


# ----------------------------------------------------------------------------- what is timed
@dataclass(frozen=True)
class Impl:
    """``kind``: ``"backend"`` (``backend`` + ``config``; ``config=None`` = its default),
    ``"dispatch"`` (the production path) or ``"deepgemm"``."""

    kind: str
    backend: str | None = None
    config: tuple | None = None  # sorted (knob, value) pairs

    @staticmethod
    def of(backend: str, config: dict | None = None) -> "Impl":
        return Impl("backend", backend, None if config is None else tuple(sorted(config.items())))

    @property
    def knobs(self) -> dict | None:
        return None if self.config is None else dict(self.config)

    @property
    def label(self) -> str:
        if self.kind != "backend":
            return self.kind
        return f"{self.backend}[{format_knobs(self.knobs) or 'default'}]"


def format_knobs(knobs: dict | None) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted((knobs or {}).items()))


def parse_knobs(text: str | None) -> dict:
    """``"ChunkK=128,WavePerEU=4"`` (``,`` or ``;``) -> ``{"ChunkK": 128, "WavePerEU": 4}``."""
    knobs = {}
    for item in filter(None, (text or "").replace(";", ",").split(",")):
        if "=" not in item:
            raise ValueError(f"knob {item!r} is not NAME=VALUE")
        name, value = (s.strip() for s in item.split("=", 1))
        try:
            knobs[name] = int(value)
        except ValueError:
            knobs[name] = value
    return knobs


def deepgemm_available() -> str | None:
    """``None`` if ``deep_gemm`` can be imported, else why not."""
    try:
        import deep_gemm  # noqa: F401
    except Exception as exc:
        return f"deep_gemm is not importable ({type(exc).__name__}: {exc})"
    return None


def deepgemm_unsupported(shape: Shape, arch: str) -> str | None:
    if arch != "sm_90" and not arch.startswith("sm_10"):
        return f"DeepGEMM's paged MQA logits targets sm_90/sm_100, not {arch}"
    if shape.preshuffle or shape.kv_block_size not in (32, 64) or shape.heads not in (32, 64):
        return "DeepGEMM serves plain (not preshuffled) caches with KVBlockSize 32/64 and H 32/64"
    return deepgemm_available()


def deepgemm_runner(inputs: dict, next_n: int, slots: int, flatten: bool = False) -> Callable[[], torch.Tensor]:
    """DeepGEMM's ``fp8_paged_mqa_logits`` on our inputs (the same co-packed uint8 cache layout).

    ``get_paged_mqa_logits_metadata(context_lens_2d, block_kv, slots)`` is computed once, outside
    the timed calls, as an engine does once per decode step. Recent DeepGEMM takes 2-D lengths
    only and, on sm_90 at next_n = 4, schedules one task per 2-SM cluster (``slots =
    num_sms // 2``; :func:`_deepgemm_calls` tries both slot counts). The call allocates and
    returns its own ``[B*next_n, max_model_len]`` logits; positions a row does not see are
    unspecified there, so only the valid positions are checked.

    ``flatten``: vLLM's sm_90 path for next_n DeepGEMM does not serve: ``B*next_n`` requests of
    next_n 1 (q as ``[B*next_n, 1, H, D]``, lengths ``[B*next_n, 1]``, block-table rows
    repeated, built once outside the timed calls), the same logits row for row.
    """
    import deep_gemm

    lens = inputs["context_lens"]
    if lens.dim() == 1:  # the 1-D form, expanded to vLLM's 2-D layout (same visibility)
        offsets = torch.arange(next_n, device=lens.device, dtype=torch.int32) - (next_n - 1)
        lens = (lens[:, None] + offsets[None, :]).clamp_min(0).to(torch.int32)
    lens = lens.contiguous()
    q, kv, w, table, mml = (inputs["q_fp8"].contiguous(), inputs["kv_cache"], inputs["weights"],
                            inputs["kv_indices"], inputs["max_model_len"])
    if flatten:
        b, n, h, d = q.shape
        q = q.reshape(b * n, 1, h, d)
        lens = lens.reshape(b * n, 1).contiguous()
        table = table.repeat_interleave(n, dim=0).contiguous()
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, inputs["kv_block_size"], slots)

    def run() -> torch.Tensor:
        return deep_gemm.fp8_paged_mqa_logits(q, kv, w, lens, table, schedule, mml, False)

    return run


def deepgemm_flattens(shape: Shape) -> bool:
    """Whether DeepGEMM is timed flattened to next_n 1 for this shape (see the module docstring)."""
    return shape.next_n not in DEEPGEMM_NEXT_N


def _deepgemm_calls(workload: Workload) -> list[Callable[[], torch.Tensor]]:
    sms = torch.cuda.get_device_properties(workload.device).multi_processor_count
    flatten = deepgemm_flattens(workload.shape)
    tries = [sms // 2, sms] if workload.shape.next_n == 4 else [sms]
    error = None
    for slots in tries:
        try:
            calls = [deepgemm_runner(inp, workload.shape.next_n, slots, flatten) for inp in workload.inputs]
            calls[0]()
            torch.cuda.synchronize(workload.device)
            return calls
        except RuntimeError as exc:  # a schedule sized for the other DeepGEMM version
            error = exc
    raise error


def runners(impl: Impl, workload: Workload) -> list[Callable]:
    """One zero-argument call per rotating copy."""
    from .op import launch

    if impl.kind == "dispatch":
        return [lambda a=a: launch(a) for a in workload.args]
    if impl.kind == "backend":
        knobs = impl.knobs
        return [lambda a=a: launch(a, backend=impl.backend, config=knobs) for a in workload.args]
    if impl.kind == "deepgemm":
        return _deepgemm_calls(workload)
    raise ValueError(f"unknown impl kind {impl.kind!r}")


# ----------------------------------------------------------------------------- check
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check(impl: Impl, workload: Workload, call: Callable) -> tuple[float, bool | None]:
    """``(calc_diff, mask_ok)`` of one call on copy 0 (``mask_ok=None``: not applicable)."""
    from .reference import calc_diff, check_logits

    args = workload.args[0]
    args.out.view(torch.int32).fill_(SENTINEL_BITS)
    before = args.out.clone()
    result = call()
    _sync(workload.device)
    ref = workload.reference()
    if impl.kind == "deepgemm":
        valid = torch.isfinite(ref)
        got = result[: ref.shape[0], : ref.shape[1]][valid]
        diff = float("inf") if bool(torch.isnan(got).any()) else calc_diff(got, ref[valid])
        return diff, None
    outcome = check_logits(args.out, before, ref)
    return outcome.calc_diff, outcome.untouched


# ----------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class Schedule:
    replays: int = 10  # graph replays (GPU) or loops (CPU); the median is reported
    min_replay_us: float = 2000.0  # a replay holds at least this much work (GPU)
    max_passes: int = 64  # at most this many passes over the copies per graph
    graph: bool = True  # False: time eager passes (the fallback when capture fails)


@dataclass
class Timing:
    us: float  # per call
    calls: int  # calls per replay
    method: str  # "graph", "eager", "eager (capture failed: ...)", "wall"
    spread: float  # (max - min) / median over replays


def _median_spread(samples: list[float]) -> tuple[float, float]:
    med = statistics.median(samples)
    return med, (max(samples) - min(samples)) / med if med > 0 else 0.0


def time_calls(calls: list[Callable], device: torch.device, schedule: Schedule = Schedule()) -> Timing:
    """Per-call time of cycling over ``calls`` (see the module docstring)."""
    if device.type != "cuda":
        for call in calls:
            call()
        samples = []
        for _ in range(schedule.replays):
            t0 = time.perf_counter()
            for call in calls:
                call()
            samples.append((time.perf_counter() - t0) * 1e6 / len(calls))
        us, spread = _median_spread(samples)
        return Timing(us, len(calls), "wall", spread)

    for call in calls:  # warm-up: compilation and first-touch happen here, never in capture
        call()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for call in calls:
        call()
    end.record()
    end.synchronize()
    pass_us = max(start.elapsed_time(end) * 1e3, 1e-3)
    passes = max(1, min(schedule.max_passes, math.ceil(schedule.min_replay_us / pass_us)))

    method, replay = "graph", None
    if schedule.graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(passes):
                    for call in calls:
                        call()
            graph.replay()
            torch.cuda.synchronize(device)
            replay = graph.replay
        except Exception as exc:  # a call that cannot be captured: time it eagerly, say so
            method = f"eager (capture failed: {type(exc).__name__}: {str(exc)[:120]})"
            torch.cuda.synchronize(device)
    else:
        method = "eager"
    if replay is None:
        def replay():
            for _ in range(passes):
                for call in calls:
                    call()

    samples = []
    for _ in range(schedule.replays):
        start.record()
        replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (passes * len(calls)))
    us, spread = _median_spread(samples)
    return Timing(us, passes * len(calls), method, spread)


# ----------------------------------------------------------------------------- one measurement
@dataclass
class Measurement:
    shape: Shape
    impl: Impl
    backend: str | None = None  # the backend that ran (dispatch: the one it chose)
    knobs: dict | None = None
    us: float | None = None
    gbps: float | None = None
    frac_of_copy_bw: float | None = None
    tflops: float | None = None
    calc_diff: float | None = None
    mask_ok: bool | None = None
    rotate: int = 0
    calls: int = 0
    spread: float | None = None  # (max - min) / median of the replays
    timing: str = ""
    status: str = "ok"  # "ok", "FAIL: ...", "ERROR: ...", "skipped: ..."
    seconds: float = 0.0  # wall time spent on this measurement (check + timing)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        return self.status.startswith(("FAIL", "ERROR"))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"], d["impl"] = asdict(self.shape), {"kind": self.impl.kind, "backend": self.impl.backend,
                                                      "config": self.impl.knobs}
        return d


def _accuracy_status(calc_diff: float, mask_ok: bool | None, threshold: float) -> str:
    problems = []
    if mask_ok is False:
        problems.append("positions outside the visible range were written")
    if not calc_diff < threshold:
        problems.append(f"calc_diff {calc_diff:.2e} >= {threshold:g}")
    return "ok" if not problems else "FAIL: " + "; ".join(problems)


def measure(impl: Impl, workload: Workload, schedule: Schedule | None = Schedule(), *, copy_gbps: float | None = None,
            threshold: float = 1e-3) -> Measurement:
    """Check ``impl`` on ``workload`` and, if it passes and ``schedule`` is given, time it.
    Never raises for a failing implementation: the status says what went wrong."""
    t0 = time.perf_counter()
    m = Measurement(workload.shape, impl, rotate=workload.copies)
    try:
        if impl.kind == "deepgemm":
            from .arch import detect

            reason = deepgemm_unsupported(workload.shape, detect(workload.device).arch)
            if reason:
                m.status = f"skipped: {reason}"
                return m
            m.backend = "deepgemm-flat" if deepgemm_flattens(workload.shape) else "deepgemm"
        elif impl.kind == "dispatch":
            from . import dispatch

            choice = dispatch.choose(workload.args[0].problem)
            m.backend, m.knobs = choice.backend, dict(choice.config)
        else:
            from . import backends

            m.backend = impl.backend
            reason = backends.why_not(impl.backend, workload.args[0].problem)
            if reason:
                m.status = f"skipped: {reason}"
                return m
            m.knobs = impl.knobs if impl.knobs is not None else \
                backends.get(impl.backend).default_config(workload.args[0].problem)
        calls = runners(impl, workload)
        m.calc_diff, m.mask_ok = check(impl, workload, calls[0])
        m.status = _accuracy_status(m.calc_diff, m.mask_ok, threshold)
        if m.ok and schedule is not None:
            timing = time_calls(calls, workload.device, schedule)
            acc, shape = workload.accounting, workload.shape
            m.us, m.calls, m.timing, m.spread = timing.us, timing.calls, timing.method, timing.spread
            if timing.method.startswith("eager (capture failed"):
                m.status = "FAIL: not capturable in a CUDA graph (the op must be; timed eagerly instead)"
            m.gbps = acc.bytes / timing.us / 1e3
            m.tflops = acc.flops(shape.heads, shape.head_dim) / timing.us / 1e6
            if copy_gbps:
                m.frac_of_copy_bw = m.gbps / copy_gbps
    except Exception as exc:
        m.status = f"ERROR: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        try:  # a failed launch may leave the device unusable; say so instead of failing later
            _sync(workload.device)
        except Exception as sync_exc:
            m.status += f" (device unusable: {type(sync_exc).__name__})"
            raise DeviceLost(m.status) from sync_exc
    finally:
        m.seconds = time.perf_counter() - t0
    return m


class DeviceLost(RuntimeError):
    """A launch broke the device context; the process cannot measure anything else."""


# ----------------------------------------------------------------------------- anchor and CSV
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
    """The anchor applies to the shapes it was measured on: plain cache, 2-D, uniform lengths."""
    if shape.preshuffle or not shape.lens_2d or shape.ragged:
        return None
    return anchor.get((shape.heads, shape.head_dim, shape.kv_block_size, shape.next_n, shape.batch, shape.context))


COLUMNS = ["impl", "backend", "knobs", "H", "D", "kv_block_size", "preshuffle", "lens_2d", "ragged", "next_n", "batch",
           "context", "us", "GBps", "frac_of_copy_bw", "TFLOPs", "calc_diff", "mask_ok", "rotate", "calls", "spread",
           "timing", "deepgemm_us", "speedup_vs_deepgemm", "anchor_us_cross_run", "speedup_vs_anchor_cross_run",
           "status"]


def _fmt(value, decimals=3) -> str:
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
    a_us = anchor_us(anchor, s)
    d_us = deepgemm.get(s) if m.impl.kind != "deepgemm" else None
    return {
        "impl": m.impl.kind, "backend": m.backend or "", "knobs": format_knobs(m.knobs), "H": s.heads,
        "D": s.head_dim, "kv_block_size": s.kv_block_size, "preshuffle": int(s.preshuffle), "lens_2d": int(s.lens_2d),
        "ragged": s.ragged or "0", "next_n": s.next_n, "batch": s.batch, "context": s.context,
        "us": _fmt(m.us, 2), "GBps": _fmt(m.gbps, 0), "frac_of_copy_bw": _fmt(m.frac_of_copy_bw, 3),
        "TFLOPs": _fmt(m.tflops, 1), "calc_diff": f"{m.calc_diff:.2e}" if m.calc_diff is not None else "",
        "mask_ok": "n/a" if m.mask_ok is None and m.calc_diff is not None else _fmt(m.mask_ok),
        "rotate": m.rotate, "calls": m.calls, "spread": _fmt(m.spread, 3), "timing": m.timing,
        "deepgemm_us": _fmt(d_us, 2), "speedup_vs_deepgemm": _fmt(d_us / m.us, 3) if d_us and m.us else "",
        "anchor_us_cross_run": _fmt(a_us, 2),
        "speedup_vs_anchor_cross_run": _fmt(a_us / m.us, 3) if a_us and m.us else "",
        "status": m.status,
    }


def write_csv(path: str, env: Environment, measurements: list[Measurement], *, command: str | None = None,
              anchor: dict | None = None) -> None:
    anchor = anchor or {}
    deepgemm = {m.shape: m.us for m in measurements if m.impl.kind == "deepgemm" and m.us}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        for line in env.header_lines(command):
            f.write(line + "\n")
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for m in measurements:
            writer.writerow(csv_row(m, anchor, deepgemm))
    os.replace(tmp, path)


def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _memory_bound(shape: Shape) -> bool:
    return shape.next_n <= 2 and shape.batch * shape.context >= 1 << 20


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
            flops = [m.tflops for m in ms if m.shape.next_n == 4 and m.shape.heads == 64 and m.tflops]
            if flops:
                text += f"; max TFLOP/s (next_n=4, H=64) {max(flops):.0f}"
            by_key = {(m.shape.heads, m.shape.batch, m.shape.context, m.shape.next_n): m.us for m in ms}
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


# ----------------------------------------------------------------------------- CLI
def _bool_list(text: str) -> list[bool]:
    return [{"0": False, "1": True, "false": False, "true": True}[x.strip().lower()] for x in text.split(",")]


def _impls(a, shape: Shape, problem) -> list[Impl]:
    from . import backends

    out = []
    if a.dispatch or not (a.backend or a.all_candidates):
        out.append(Impl("dispatch"))
    names = a.backend.split(",") if a.backend else []
    if a.all_candidates and not names:
        names = [n for n in backends.names() if backends.why_not(n, problem) is None]
    config = parse_knobs(a.config) if a.config else None
    for name in names:
        if a.all_candidates and backends.why_not(name, problem) is None:
            out.extend(Impl.of(name, c) for c in backends.get(name).candidates(problem))
        else:
            out.append(Impl.of(name, config))
    if a.deepgemm:
        out.append(Impl("deepgemm"))
    return list(dict.fromkeys(out))


def _problem_for(shape: Shape, env: Environment, device):
    from .problem import Problem

    return Problem(arch=env.arch, cu_num=env.cu_num, batch=shape.batch, next_n=shape.next_n, heads=shape.heads,
                   head_dim=shape.head_dim, kv_block_size=shape.kv_block_size, preshuffle=shape.preshuffle,
                   context=shape.context, lens_2d=shape.lens_2d, fp8="fnuz" if env.arch == "gfx942" else "fn",
                   device_type=torch.device(device).type, max_model_len=shape.context)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m paged_mqa_logits bench",
        description="Time backends, knob sets, the production dispatch and (if importable) DeepGEMM in the "
                    "same run with the method of docs/BENCHMARK.md; writes a CSV and exits non-zero if any shape "
                    "fails its check.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("shapes (a grid, or --shapes FILE)")
    g.add_argument("--heads", default="32,64")
    g.add_argument("--next-n", default="1,2,3,4")
    g.add_argument("--batch", default="1,8,32,64,128,256")
    g.add_argument("--context", default=None, help="default 8192,32768 (with --shapes: overrides the file's)")
    g.add_argument("--kv-block-size", default="64")
    g.add_argument("--head-dim", type=int, default=HEAD_DIM)
    g.add_argument("--preshuffle", action="store_true", help="preshuffled cache (see --preshuffle-values for both)")
    g.add_argument("--preshuffle-values", default=None, help="e.g. 0,1 to bench both layouts")
    g.add_argument("--lens-1d", action="store_true", help="1-D context_lens instead of vLLM's 2-D layout")
    lengths = g.add_mutually_exclusive_group()
    lengths.add_argument("--ragged", action="store_true", help="per-sequence contexts in [context/2, context]")
    lengths.add_argument("--wide-ragged", action="store_true",
                         help="per-sequence contexts uniform in [1, context], as in serving decode batches")
    g.add_argument("--shapes", default=None,
                   help="CSV of shapes: heads,next_n,batch,context (or contexts) [,kv_block_size,preshuffle]")
    i = p.add_argument_group("what to time (default: the production dispatch)")
    i.add_argument("--backend", default=None, help="backend name(s), comma-separated")
    i.add_argument("--config", default=None, help="knobs for --backend, e.g. 'ChunkK=128,SplitKV=0'")
    i.add_argument("--all-candidates", action="store_true", help="every tuner candidate of the backend(s)")
    i.add_argument("--dispatch", action="store_true", help="also time the production dispatch")
    i.add_argument("--deepgemm", action="store_true",
                   help="also time DeepGEMM's fp8_paged_mqa_logits on the same inputs (flattened to next_n 1 "
                        "where it refuses the next_n, as vLLM runs it)")
    i.add_argument("--no-hint", action="store_true", help="call without context_hint (the table's 'any' rows)")
    m = p.add_argument_group("method")
    m.add_argument("--device", default=None, help="cuda / cuda:1 / cpu (default: a GPU if present)")
    m.add_argument("--replays", type=int, default=None, help="graph replays per measurement (default GPU 10, CPU 3)")
    m.add_argument("--copies", type=int, default=None, help="rotating copies (default: past 4x L2, >= 512 MiB)")
    m.add_argument("--max-copies", type=int, default=256)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--anchor", default=None,
                   help="DeepGEMM timings from another run (CSV); its ratios are reported as cross-run")
    m.add_argument("--out", default=None, help="CSV to write (default: print only)")
    m.add_argument("--fail-fast", action="store_true")
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    for option, text in (("--heads", a.heads), ("--next-n", a.next_n), ("--batch", a.batch),
                         ("--context", a.context), ("--kv-block-size", a.kv_block_size)):
        try:
            values = _int_list(text) if text is not None else [1]
        except ValueError:
            p.error(f"argument {option}: expected comma-separated positive integers, got {text!r}")
        if not values or min(values) < 1:
            p.error(f"argument {option}: expected comma-separated positive integers, got {text!r}")
    if a.backend:
        from . import backends

        unknown = [n for n in a.backend.split(",") if n not in backends.names()]
        if unknown:
            p.error(f"argument --backend: unknown backend(s) {', '.join(unknown)}; known: {', '.join(backends.names())}")
    pre = _bool_list(a.preshuffle_values) if a.preshuffle_values else [a.preshuffle]
    ragged = "wide" if a.wide_ragged else ("half" if a.ragged else "")
    if a.shapes:
        shapes = shapes_from_csv(a.shapes, contexts=_int_list(a.context) if a.context else None,
                                 lens_2d=not a.lens_1d, ragged=ragged)
    else:
        shapes = grid_shapes(_int_list(a.heads), _int_list(a.next_n), _int_list(a.batch),
                             _int_list(a.context or "8192,32768"), _int_list(a.kv_block_size), pre,
                             lens_2d=not a.lens_1d, ragged=ragged, head_dim=a.head_dim)
    if a.config and (not a.backend or "," in a.backend):
        p.error("--config needs exactly one --backend")
    if a.deepgemm and deepgemm_available():
        print(f"note: --deepgemm: {deepgemm_available()}; DeepGEMM rows are marked skipped", file=sys.stderr)

    env = environment(device)
    anchor = load_anchor(a.anchor)
    schedule = Schedule(replays=a.replays or (10 if device.type == "cuda" else 3))
    command = "python -m paged_mqa_logits bench " + " ".join(argv if argv is not None else sys.argv[1:])
    for line in env.header_lines(command):
        print(line)

    from tqdm import tqdm

    results: list[Measurement] = []
    bar = tqdm(total=len(shapes), unit="shape", disable=a.quiet, file=sys.stderr, dynamic_ncols=True)
    failed = lost = False
    for shape in shapes:
        impls = _impls(a, shape, _problem_for(shape, env, device))
        try:
            workload = build_workload(shape, device, copies=a.copies, max_copies=a.max_copies, seed=a.seed,
                                      context_hint=None if a.no_hint else "context", arch=env.arch)
        except Exception as exc:
            status = f"ERROR: building inputs: {type(exc).__name__}: {exc}"[:300]
            results.extend(Measurement(shape, impl, status=status) for impl in impls)
            failed = True
            tqdm.write(f"{status} -- {shape.describe()}", file=sys.stderr)
            workload = None
        for impl in impls if workload is not None else []:
            try:
                m = measure(impl, workload, schedule, copy_gbps=env.copy_gbps)
            except DeviceLost as exc:
                m, lost = Measurement(shape, impl, rotate=workload.copies, status=str(exc)), True
            results.append(m)
            failed |= m.failed
            bar.set_postfix_str(f"{impl.label}: " + (f"{m.us:.2f} us" if m.us else m.status)[:40])
            if m.failed:
                tqdm.write(f"{m.status} -- {shape.describe()} {impl.label}", file=sys.stderr)
            if lost:
                break
        del workload
        if device.type == "cuda" and not lost:
            torch.cuda.empty_cache()
        bar.update(1)
        if a.out:  # keep what was measured if a later shape takes the process down
            write_csv(a.out, env, results, command=command, anchor=anchor)
        if lost or (failed and a.fail_fast):
            break
    bar.close()

    print_table(results, anchor)
    for line in summary(results, anchor):
        print("# " + line)
    if a.out:
        print(f"# wrote {a.out}")
    if failed:
        print("# FAILED: at least one shape failed its accuracy check or raised (see status)", file=sys.stderr)
    return 1 if failed else 0


def print_table(results: list[Measurement], anchor: dict, file=None) -> None:
    deepgemm = {m.shape: m.us for m in results if m.impl.kind == "deepgemm" and m.us}
    cols = ["impl", "backend", "knobs", "H", "next_n", "batch", "context", "ragged", "us", "GBps",
            "frac_of_copy_bw", "TFLOPs", "calc_diff", "speedup_vs_deepgemm", "status"]
    rows = [cols] + [[str(csv_row(m, anchor, deepgemm)[c]) for c in cols] for m in results]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip(), file=file)


if __name__ == "__main__":
    sys.exit(main())
