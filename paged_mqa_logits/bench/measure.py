"""What is timed (:class:`Impl`), the accuracy check every shape gets, the CUDA-graph timing
loop, and :func:`measure`, which puts them together and never raises for a failing
implementation."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from .. import backends, dispatch
from ..arch import detect
from ..op import launch
from ..reference import calc_diff, check_logits
from .deepgemm import deepgemm_calls, deepgemm_flattens, deepgemm_unsupported
from .environment import l2_bytes
from .shapes import Shape
from .workload import Workload

SENTINEL_BITS = 0x7FBADBAD  # a signalling-NaN payload no kernel computes: "never written"
#: the same for bf16 logits, whose NaNs have 7 payload bits
SENTINEL_BITS_BF16 = 0x7FBA


def fill_sentinel(out: torch.Tensor) -> None:
    """Fill ``out`` (fp32 or bf16 logits) with the "never written" NaN of its dtype."""
    if out.dtype == torch.bfloat16:
        out.view(torch.int16).fill_(SENTINEL_BITS_BF16)
    else:
        out.view(torch.int32).fill_(SENTINEL_BITS)


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


def runners(impl: Impl, workload: Workload, clean_logits: bool = False) -> list[Callable]:
    """One zero-argument call per rotating copy (``clean_logits``: the op's ``-inf`` fill too)."""

    calls = (workload.cleaning() if clean_logits else workload).args
    if impl.kind == "dispatch":
        return [lambda a=a: launch(a) for a in calls]
    if impl.kind == "backend":
        knobs = impl.knobs
        return [lambda a=a: launch(a, backend=impl.backend, config=knobs) for a in calls]
    if impl.kind == "deepgemm":
        if clean_logits:
            raise ValueError("--clean-logits times this package's kernels only (DeepGEMM's cleaning is its own call)")
        return deepgemm_calls(workload)
    raise ValueError(f"unknown impl kind {impl.kind!r}")

# ----------------------------------------------------------------------------- check
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check(impl: Impl, workload: Workload, call: Callable, clean_logits: bool = False) -> tuple[float, bool | None]:
    """``(calc_diff, mask_ok)`` of one call on copy 0 (``mask_ok=None``: not applicable); with
    ``clean_logits`` every position a row does not see must be ``-inf``."""

    args = workload.args[0]
    fill_sentinel(args.out)
    before = args.out.clone()
    result = call()
    _sync(workload.device)
    ref = workload.reference()
    if impl.kind == "deepgemm":
        valid = torch.isfinite(ref)
        got = result[: ref.shape[0], : ref.shape[1]][valid]
        diff = float("inf") if bool(torch.isnan(got).any()) else calc_diff(got, ref[valid])
        return diff, None
    outcome = check_logits(args.out, before, ref, clean_logits=clean_logits)
    return outcome.calc_diff, outcome.untouched


# ----------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class Schedule:
    replays: int = 10  # graph replays (GPU) or loops (CPU); the median is reported
    min_replay_us: float = 2000.0  # a replay holds at least this much work (GPU)
    max_passes: int = 64  # at most this many passes over the copies per graph
    graph: bool = True  # False: time eager passes (the fallback when capture fails)
    cold_l2: bool = False  # GPU: flush the L2 before every call and time each call alone


@dataclass
class Timing:
    us: float  # per call
    calls: int  # calls per replay
    method: str  # "graph", "eager", "eager (capture failed: ...)", "wall"
    spread: float  # (max - min) / median over replays


def _median_spread(samples: list[float]) -> tuple[float, float]:
    med = statistics.median(samples)
    return med, (max(samples) - min(samples)) / med if med > 0 else 0.0


def cold_samples(runs: list[Callable], flush: Callable, new_event: Callable, synchronize: Callable,
                 replays: int) -> list[float]:
    """Per replay, the mean microseconds of one call over ``runs``, each run preceded by
    ``flush`` (outside its timed region) and bracketed by its own pair of events from
    ``new_event`` (CUDA events: their ``elapsed_time`` is in milliseconds)."""
    samples = []
    for _ in range(replays):
        pairs = []
        for run in runs:
            flush()
            start, end = new_event(), new_event()
            start.record()
            run()
            end.record()
            pairs.append((start, end))
        synchronize()
        samples.append(statistics.fmean(start.elapsed_time(end) for start, end in pairs) * 1e3)
    return samples


def _warm_up(calls: list[Callable], device: torch.device) -> None:
    """Every call once outside any capture: compilation and first-touch happen here, never in
    a graph or a timed region."""
    for call in calls:
        call()
    torch.cuda.synchronize(device)


def _capture_failed(exc: Exception, device: torch.device) -> str:
    """The timing method of calls that could not be captured (``measure`` fails them)."""
    torch.cuda.synchronize(device)
    return f"eager (capture failed: {type(exc).__name__}: {str(exc)[:120]})"


def _time_cold_l2(calls: list[Callable], device: torch.device, schedule: Schedule) -> Timing:
    """``Schedule.cold_l2``: each call captured in a graph of its own and replayed after a
    write of twice the L2 (vendors' cold-cache timing); the call's time is between events
    around its replay alone, so the flush is not in it."""
    _warm_up(calls, device)
    runs = []
    try:
        for call in calls:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            runs.append(graph.replay)
        method = "cold-l2"
    except Exception as exc:  # as in time_calls: timed eagerly, and the measurement fails
        runs, method = list(calls), _capture_failed(exc, device)
    scratch = torch.empty(max(2 * l2_bytes(device), 64 << 20), dtype=torch.uint8, device=device)
    samples = cold_samples(runs, scratch.zero_, lambda: torch.cuda.Event(enable_timing=True),
                           lambda: torch.cuda.synchronize(device), schedule.replays)
    us, spread = _median_spread(samples)
    return Timing(us, len(runs), method, spread)


def time_calls(calls: list[Callable], device: torch.device, schedule: Schedule = Schedule()) -> Timing:
    """Per-call time of cycling over ``calls`` (see the module docstring), or with
    ``schedule.cold_l2`` on a GPU, of each call after an L2 flush."""
    if device.type == "cuda" and schedule.cold_l2:
        return _time_cold_l2(calls, device, schedule)
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

    _warm_up(calls, device)
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
            method = _capture_failed(exc, device)
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


def capture_status(timing: Timing) -> str | None:
    """The failure a timing records, else ``None``: calls that could not be captured in a CUDA
    graph (every op of the package must be capturable) were timed eagerly."""
    if timing.method.startswith("eager (capture failed"):
        return "FAIL: not capturable in a CUDA graph (the op must be; timed eagerly instead)"
    return None


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
        d["shape"], d["impl"] = self.shape.as_dict(), {"kind": self.impl.kind, "backend": self.impl.backend,
                                                      "config": self.impl.knobs}
        return d


def accuracy_status(calc_diff: float, mask_ok: bool | None, threshold: float) -> str:
    """``"ok"``, or ``"FAIL: ..."`` naming what a logits check found (written positions a row does
    not see, ``calc_diff`` not below ``threshold``)."""
    problems = []
    if mask_ok is False:
        problems.append("positions outside the visible range were written")
    if not calc_diff < threshold:
        problems.append(f"calc_diff {calc_diff:.2e} >= {threshold:g}")
    return "ok" if not problems else "FAIL: " + "; ".join(problems)


def measure(impl: Impl, workload: Workload, schedule: Schedule | None = Schedule(), *, copy_gbps: float | None = None,
            threshold: float = 1e-3, clean_logits: bool = False) -> Measurement:
    """Check ``impl`` on ``workload`` and, if it passes and ``schedule`` is given, time it
    (``clean_logits``: calls that also fill the invisible positions with ``-inf``). Never raises
    for a failing implementation: the status says what went wrong."""
    t0 = time.perf_counter()
    m = Measurement(workload.shape, impl, rotate=workload.copies)
    try:
        if impl.kind == "deepgemm":

            reason = deepgemm_unsupported(workload.shape, detect(workload.device).arch)
            if reason:
                m.status = f"skipped: {reason}"
                return m
            m.backend = "deepgemm-flat" if deepgemm_flattens(workload.shape) else "deepgemm"
        elif impl.kind == "dispatch":

            choice = dispatch.choose(workload.args[0].problem, workload.args[0].target)
            m.backend, m.knobs = choice.backend, dict(choice.config)
        else:

            m.backend = impl.backend
            reason = backends.why_not(impl.backend, workload.args[0].problem, workload.args[0].target)
            if reason:
                m.status = f"skipped: {reason}"
                return m
            m.knobs = impl.knobs if impl.knobs is not None else \
                backends.get(impl.backend).default_config(workload.args[0].problem)
        calls = runners(impl, workload, clean_logits)
        m.calc_diff, m.mask_ok = check(impl, workload, calls[0], clean_logits)
        m.status = accuracy_status(m.calc_diff, m.mask_ok, threshold)
        if m.ok and schedule is not None:
            timing = time_calls(calls, workload.device, schedule)
            acc, shape = workload.accounting, workload.shape
            m.us, m.calls, m.timing, m.spread = timing.us, timing.calls, timing.method, timing.spread
            m.status = capture_status(timing) or m.status
            m.gbps = acc.bytes / timing.us / 1e3
            m.tflops = acc.flops(shape.shape_key.heads, shape.shape_key.head_dim) / timing.us / 1e6
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
