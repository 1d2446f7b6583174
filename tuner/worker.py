"""Worker processes: candidates run there, so one that crashes or hangs costs a restart, not the run.

A worker is a long-lived process bound to one device. It receives :class:`Task` messages (one
shape, a list of implementations), builds the shape's rotating inputs once, and measures the
implementations one by one with :func:`paged_mqa_logits.bench.measure`, announcing each one
before it starts. The coordinator (:class:`Pool`) therefore always knows which candidate is in
flight: if the worker's pipe closes (a segfault, ``os._exit``, a device fault) or no message
arrives within the per-candidate timeout (a hang), the worker is killed, that candidate is
recorded as failed with the reason, a fresh worker is started and the task resumes after it.
The common case pays one process start per worker, not per candidate.

A task may carry two stages: ``screen`` (every implementation, a short timing schedule) and
``confirm`` (the ``confirm_top`` fastest of the screen, re-timed with the full schedule).

Workers die with their coordinator, even in the middle of a hanging candidate: on Linux the
kernel sends them ``SIGKILL`` when it exits (``prctl(PR_SET_PDEATHSIG)``; the pool must then
start workers from a thread that lives as long as it does, as :func:`tuner.tune` does), and
everywhere a watchdog thread exits the process once its parent is gone.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

STARTUP_TIMEOUT = 600.0  # importing torch and the backends on a cold file system


@dataclass
class Task:
    """One shape on one worker: check (``screen=None``) or time a list of implementations."""

    id: int
    shape: object  # bench.Shape
    impls: list  # bench.Impl
    screen: object | None = None  # bench.Schedule of the first stage; None: check only
    confirm: object | None = None  # bench.Schedule of the second stage
    confirm_top: int = 0
    workload: dict = field(default_factory=dict)  # build_workload options
    meta: dict = field(default_factory=dict)  # the coordinator's bookkeeping (key, context, phase)
    results: dict = field(default_factory=dict)  # (impl index, stage) -> bench.Measurement
    build_crashes: int = 0
    started: float = 0.0

    def message(self) -> dict:
        screened = {i: m for (i, stage), m in self.results.items() if stage == "screen"}
        return {
            "id": self.id, "shape": self.shape, "impls": self.impls, "workload": self.workload,
            "todo": [i for i in range(len(self.impls)) if i not in screened],
            "prior": {i: m.us for i, m in screened.items() if m.ok and m.us},
            "screen": self.screen, "confirm": self.confirm, "confirm_top": self.confirm_top,
            "confirmed": [i for (i, stage) in self.results if stage == "confirm"],
        }


# ----------------------------------------------------------------------------- the child side
class _Child:
    def __init__(self, device):
        self.device = device
        self.cached = None  # (shape, options, workload): consecutive tasks of one shape share inputs
        self.gbps = None

    def workload(self, shape, options):
        """The rotating inputs of ``shape``; the previous task's when only the hint differs."""
        from paged_mqa_logits import bench

        hint = options.get("context_hint", "context")
        hint = shape.context if hint == "context" else hint
        same = {k: v for k, v in options.items() if k != "context_hint"}
        if self.cached and self.cached[0] == shape and self.cached[1] == same:
            return self.cached[2].with_hint(hint)
        self.cached = None  # free the previous shape's copies before building the next
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        wl = bench.build_workload(shape, self.device, **options)
        self.cached = (shape, same, wl)
        return wl

    def copy_gbps(self):
        if self.gbps is None:
            from paged_mqa_logits import bench

            self.gbps = bench.copy_bandwidth(self.device)
        return self.gbps

    def run(self, task: dict, send) -> None:
        from paged_mqa_logits import bench

        tid = task["id"]
        wl = self.workload(task["shape"], task["workload"])
        send(("workload", tid, {"copies": wl.copies, "bytes": wl.working_set_bytes}))
        screen, gbps = task["screen"], (self.copy_gbps() if task["screen"] else None)
        scores = dict(task["prior"])
        for idx in task["todo"]:
            send(("start", tid, (idx, "screen")))
            m = bench.measure(task["impls"][idx], wl, screen, copy_gbps=gbps)
            send(("result", tid, (idx, "screen", m)))
            if m.ok and m.us:
                scores[idx] = m.us
        if screen is None or not task["confirm_top"]:
            return
        for idx in sorted(scores, key=scores.get)[: task["confirm_top"]]:
            if idx in task["confirmed"]:
                continue
            send(("start", tid, (idx, "confirm")))
            m = bench.measure(task["impls"][idx], wl, task["confirm"], copy_gbps=gbps)
            send(("result", tid, (idx, "confirm", m)))


PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCHDOG_PERIOD = 0.5  # seconds between the orphan checks


def die_with_parent(coordinator_pid: int) -> None:
    """Make this process exit when ``coordinator_pid`` (its parent) does, whatever it is doing.

    ``PR_SET_PDEATHSIG`` covers a process stuck in native code; the watchdog thread covers
    other platforms. If the coordinator is already gone (it died before this ran), exit now.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            if os.getppid() != coordinator_pid:
                os._exit(70)
            time.sleep(WATCHDOG_PERIOD)

    if os.getppid() != coordinator_pid:
        os._exit(70)
    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()


def _child_main(conn, device: str, env: dict, coordinator_pid: int) -> None:
    die_with_parent(coordinator_pid)
    os.environ.update(env)
    import torch

    from paged_mqa_logits import bench, reload_tuned_table

    from .candidates import load_extra_backends

    load_extra_backends()
    reload_tuned_table()
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    child = _Child(dev)
    conn.send(("hello", None, {"pid": os.getpid(), "device": device}))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            child.run(task, conn.send)
        except bench.DeviceLost as exc:  # the context is gone: report and let the pool restart us
            conn.send(("fatal", task["id"], str(exc)))
            conn.close()
            os._exit(3)
        except bench.ShapeDoesNotFit as exc:  # the device's size, not a failure of the candidates
            conn.send(("task_skipped", task["id"], str(exc)))
        except Exception as exc:
            conn.send(("task_error", task["id"], f"{type(exc).__name__}: {exc}"[:300]))
        conn.send(("done", task["id"], None))


# ----------------------------------------------------------------------------- the coordinator side
def _death_reason(proc) -> str:
    code = proc.exitcode
    if code is None:
        return "worker did not exit"
    if code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


class _Worker:
    def __init__(self, ctx, slot: int, device: str, env: dict):
        self.slot, self.device = slot, device
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child, device, env, os.getpid()), name=f"tuner-worker-{slot}")
        self.proc.start()
        child.close()
        self.ready = False
        self.task: Task | None = None
        self.in_flight: tuple | None = None  # (impl index, stage)
        self.deadline = time.monotonic() + STARTUP_TIMEOUT

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()


class Pool:
    """Worker processes on ``devices`` (one each) running :class:`Task` s from a source.

    ``source`` provides ``next_task() -> Task | None`` (called whenever a worker is idle; ``None``
    means nothing to start now), ``record(task, index, stage, measurement)`` and
    ``task_done(task)``.
    """

    def __init__(self, devices: list[str], *, timeout: float, build_timeout: float = 600.0, env: dict | None = None,
                 log=print):
        self.ctx = multiprocessing.get_context("spawn")
        self.devices = list(devices)
        self.timeout, self.build_timeout = timeout, build_timeout
        self.env = dict(env or {})
        self.log = log
        self.workers: list[_Worker] = []
        self.requeued: deque[Task] = deque()
        self.restarts = 0

    # -- lifecycle
    def _spawn(self, slot: int) -> _Worker:
        return _Worker(self.ctx, slot, self.devices[slot % len(self.devices)], self.env)

    def resize(self, devices: list[str]) -> None:
        """Keep the first ``len(devices)`` workers (same devices, modulo order), stop the rest."""
        keep = [w for w in self.workers[: len(devices)] if w.device == devices[w.slot]]
        self._stop([w for w in self.workers if w not in keep])
        self.workers, self.devices = keep, list(devices)

    @staticmethod
    def _stop(workers: list[_Worker]) -> None:
        """Ask every worker to exit, then wait for all (process exits overlap), then kill stragglers."""
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 10
        for w in workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            w.kill()

    def close(self) -> None:
        self._stop(self.workers)
        self.workers = []

    def abort(self) -> None:
        """Kill every worker now (their tasks are dropped, nothing is recorded)."""
        for w in self.workers:
            w.kill()
        self.workers = []
        self.requeued.clear()

    # -- the event loop
    def run(self, source, *, deadline: float | None = None) -> bool:
        """Run tasks until the source has none left and every worker is idle. Returns False if
        ``deadline`` (``time.monotonic()``) passed first (the pool is then aborted)."""
        while len(self.workers) < len(self.devices):
            self.workers.append(self._spawn(len(self.workers)))
        while True:
            source_idle = False
            for w in self.workers:
                if w.ready and w.task is None:
                    task = self.requeued.popleft() if self.requeued else source.next_task()
                    if task is None:
                        source_idle = True
                    else:
                        self._send(w, task)
            watched = [w for w in self.workers if not w.ready or w.task is not None]
            if source_idle and not self.requeued and not any(w.task is not None for w in self.workers):
                return True
            now = time.monotonic()
            if deadline is not None and now > deadline:
                self.abort()
                return False
            wake = min([w.deadline for w in watched] + ([deadline] if deadline else []), default=now + 1)
            ready = multiprocessing.connection.wait([w.conn for w in watched], timeout=max(0.0, min(wake - now, 1.0)))
            for w in watched:
                if w.conn in ready:
                    self._drain(w, source)
            now = time.monotonic()
            for w in list(self.workers):
                if (not w.ready or w.task is not None) and now > w.deadline:
                    what = "starting" if not w.ready else "candidate" if w.in_flight else "building inputs"
                    limit = self.timeout if w.in_flight else STARTUP_TIMEOUT if not w.ready else self.build_timeout
                    self._replace(w, source, f"timed out after {limit:.0f} s ({what}; worker killed)")

    def _send(self, w: _Worker, task: Task) -> None:
        if not task.started:
            task.started = time.monotonic()
        w.task, w.in_flight = task, None
        w.deadline = time.monotonic() + self.build_timeout
        w.conn.send(task.message())

    def _drain(self, w: _Worker, source) -> None:
        while True:
            try:
                if not w.conn.poll():
                    return
                kind, _tid, payload = w.conn.recv()
            except (EOFError, OSError):
                w.proc.join(5)
                self._replace(w, source, _death_reason(w.proc))
                return
            now = time.monotonic()
            w.deadline = now + self.timeout
            if kind == "hello":
                w.ready = True
            elif kind == "workload":
                pass
            elif kind == "start":
                w.in_flight = payload
            elif kind == "result":
                idx, stage, m = payload
                w.task.results[(idx, stage)] = m
                w.in_flight = None
                source.record(w.task, idx, stage, m)
            elif kind == "task_error":
                self._fail_rest(w.task, source, f"ERROR: {payload}")
            elif kind == "task_skipped":
                from paged_mqa_logits.bench import SKIPPED_FOR_MEMORY

                self._fail_rest(w.task, source, f"{SKIPPED_FOR_MEMORY}{payload}")
            elif kind == "fatal":
                w.proc.join(10)
                self._replace(w, source, payload)
                return
            elif kind == "done":
                task, w.task = w.task, None
                source.task_done(task)

    def _fail_rest(self, task: Task, source, status: str) -> None:
        """Record ``status`` for every implementation of ``task`` not measured yet."""
        from paged_mqa_logits.bench import Measurement

        for i, impl in enumerate(task.impls):
            if (i, "screen") not in task.results:
                m = Measurement(task.shape, impl, status=status)
                task.results[(i, "screen")] = m
                source.record(task, i, "screen", m)

    def _replace(self, w: _Worker, source, reason: str) -> None:
        """The worker died or hung: record the candidate in flight as failed, restart the
        worker, and requeue the rest of its task."""
        from paged_mqa_logits.bench import Measurement

        task, in_flight = w.task, w.in_flight
        w.kill()
        if not w.ready:
            raise RuntimeError(f"tuner worker {w.slot} on {w.device} failed to start: {reason}")
        self.restarts += 1
        self.workers[self.workers.index(w)] = self._spawn(w.slot)
        if task is None:
            return
        if in_flight is not None:
            idx, stage = in_flight
            m = Measurement(task.shape, task.impls[idx], status=f"ERROR: {reason}")
            task.results[(idx, stage)] = m
            source.record(task, idx, stage, m)
        else:
            task.build_crashes += 1
            if task.build_crashes >= 2:
                self._fail_rest(task, source, f"ERROR: building inputs failed twice: {reason}")
                source.task_done(task)
                return
        self.log(f"[tuner] {reason}; worker {w.slot} restarted, task resumes")
        self.requeued.append(task)

