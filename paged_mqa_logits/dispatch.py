"""Problem key -> (backend, knobs): the table lookup, per-arch defaults and the fallback chain.

A backend that cannot serve a call (unsupported shape, package missing, wrong arch) is
skipped down the arch's fallback chain. Every backend implements the same contract, so a
fallback changes speed, never the output.

A decision is asked for a :class:`Problem` (what the call is) on a :class:`Target` (where it
runs: the tensors' device type, or a call only described). Backends judge the problem; whether
this machine can launch a backend's kernels is asked of the target, and not for a hypothetical
one (``backends.registry.why_not``). Without a target, a call's own chip with its tensors on it
(:meth:`Target.present`) is meant.

A :class:`Dispatcher` owns what a decision needs and what it remembers: its backends (a
registry, injected), its table source, its cache of decisions per (problem, target) and its
record of launch failures. The op, ``explain``, warm-up, the AOT tools and the tuner use the
default instance :data:`DEFAULT` through the module functions below (:func:`choose`,
:func:`decide`, :func:`record_failure`, ...), which forward to it. With
``AITER_LOG_TUNED_CONFIG=1`` (or ``PAGED_MQA_LOGITS_LOG_TUNED_CONFIG=1``) each new key a
dispatcher caches logs one line saying which row or rule was used, from which file.

A choice whose launch raised (a compile or launch error) is reported to
:meth:`Dispatcher.record_failure` by the op: it logs one warning, remembers ``(problem, target,
backend, knobs)`` so that choice is never made again by that dispatcher, and the next decision for the
key falls down the chain. Only decisions made from a fully loaded table are cached, and a
decision that raced a :meth:`Dispatcher.reset` is not cached.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import table
from .backends import registry
from .problem import Problem, Target, resolve_target
from .errors import env_flag

LOG_ENV = ("AITER_LOG_TUNED_CONFIG", "PAGED_MQA_LOGITS_LOG_TUNED_CONFIG")
logger = logging.getLogger("paged_mqa_logits")
#: the dispatch picks that ``AITER_LOG_TUNED_CONFIG`` / ``PAGED_MQA_LOGITS_LOG_TUNED_CONFIG`` show
pick_logger = logging.getLogger("paged_mqa_logits.tuned_config")


def arch_fallback_chain(arch: str) -> tuple[str, ...]:
    """The package's policy: backends tried, in order, after the table's pick (or as the defaults)."""
    if arch == "cpu":
        return ("torch", "triton")
    if arch.startswith("gfx"):
        return ("gluon", "flydsl", "triton", "torch")
    if arch == "sm_90":
        return ("gluon", "triton", "torch")
    return ("triton", "torch")


@dataclass
class Choice:
    backend: str
    config: dict
    rule: str  # which rule chose the backend
    source: str  # "path:line" of the table row, or "defaults"
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (backend, why not)
    #: when a choice skipped for a transient failure may be tried again (``Dispatcher`` clock);
    #: ``None``: the decision stands
    revisit_at: float | None = None

    def describe(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(self.config.items())) or "defaults"
        text = f"backend={self.backend} [{knobs}] rule: {self.rule} (from {self.source})"
        for name, why in self.skipped:
            text += f"; skipped {name}: {why}"
        return text


#: launch errors that say nothing lasting about the choice (the operating system, the file
#: system, a timeout): the choice is tried again after a pause instead of never
TRANSIENT_ERRORS = (OSError, TimeoutError, subprocess.TimeoutExpired)
RETRY_PAUSE_S, MAX_RETRY_PAUSE_S = 30.0, 3600.0


def capturing(target: Target) -> bool:
    """Whether the current stream of ``target``'s device type is capturing a CUDA/HIP graph."""
    return target.device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def knobs_key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items() if v is not None))


def _log_enabled() -> bool:
    return any(env_flag(name, os.environ.get(name)) for name in LOG_ENV)


def _pick_logger() -> logging.Logger:
    """Where the picks go when asked for: a logger of its own at INFO that does not propagate,
    so an application's logging configuration (a root level of WARNING, say) cannot hide what
    the variable asked to see; stderr unless the application attached a handler to it."""
    if not pick_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[paged_mqa_logits] %(message)s"))
        pick_logger.addHandler(handler)
    pick_logger.setLevel(logging.INFO)
    pick_logger.propagate = False
    return pick_logger


class Dispatcher:
    """Decides which backend and knobs serve a problem, caches the decision, and remembers the
    choices whose launch failed. Thread-safe: one lock guards the cache and the failure record.

    ``backends``: an object with ``get(name)`` and ``why_not(name, problem, target)`` (the
    package's registry by default); ``tables``: one with ``lookup(problem) -> table.Match`` and ``reset()``
    (the configured table files by default); ``fallback_chain``: arch -> backend names tried
    after the table's pick (:func:`arch_fallback_chain` by default). Two dispatchers share
    nothing but what they are given.
    """

    def __init__(self, backends=registry.DEFAULT, tables=table.CONFIGURED,
                 fallback_chain: Callable[[str], tuple[str, ...]] = arch_fallback_chain,
                 clock: Callable[[], float] = time.monotonic):
        self.backends = backends
        self.tables = tables
        self.fallback_chain = fallback_chain
        self.clock = clock
        self._cache: dict[tuple[Problem, Target], Choice] = {}
        #: (problem, target, backend, knobs key) -> the error its launch raised
        self._failed: dict[tuple, str] = {}
        #: the same keys, for transient failures: (when it may be tried again, the pause before it)
        self._retry: dict[tuple, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by reset(): a decision begun before it is not cached

    def choose(self, problem: Problem, target: Target | None = None) -> Choice:
        """Cached: the backend and knobs that serve ``problem`` on ``target``."""
        key = (problem, resolve_target(problem, target))
        choice = self._cache.get(key)
        if choice is not None and choice.revisit_at is not None and self.clock() >= choice.revisit_at \
                and not capturing(key[1]):  # a graph being captured keeps what was warmed up
            choice = None
        if choice is None:
            generation = self._generation
            choice = self.decide(*key)  # loads the table (under its lock) before looking anything up
            with self._lock:
                if generation != self._generation:
                    return choice
                cached = self._cache.get(key)
                if cached is not None and cached.revisit_at is None:  # another thread decided first
                    return cached
                self._cache[key] = choice
            if _log_enabled():
                _pick_logger().info("%s -> %s", problem.describe(), choice.describe())
        return choice

    def decide(self, problem: Problem, target: Target | None = None) -> Choice:
        """The decision for ``problem`` on ``target``, made now and not cached (:meth:`choose`
        caches it): the table's row if its backend can serve, else the first link of the arch's
        fallback chain that can. A choice whose launch failed before cannot serve."""
        backends = self.backends
        target = resolve_target(problem, target)
        match = self.tables.lookup(problem)
        skipped: list[tuple[str, str]] = []
        revisits: list[float] = []  # when the choices skipped for transient failures may serve again
        if match.row is not None:
            row = match.row
            reason = (backends.why_not(row.backend, problem, target)
                      or self._failure(problem, target, row.backend, row.knobs, revisits))
            if reason is None:
                return Choice(row.backend, row.knobs, match.rule, row.source)
            skipped.append((row.backend, reason))
            rule = f"fallback: table row {row.source} names {row.backend}, which cannot serve"
        else:
            rule = f"default for {problem.arch} ({match.rule})"
        for name in self.fallback_chain(problem.arch):
            if any(name == s for s, _ in skipped):
                continue
            reason = backends.why_not(name, problem, target)
            if reason is None:
                config = backends.get(name).default_config(problem)
                reason = self._failure(problem, target, name, config, revisits)
                if reason is None:
                    return Choice(name, config, rule, "defaults", skipped, min(revisits, default=None))
            skipped.append((name, reason))
        details = "; ".join(f"{n}: {r}" for n, r in skipped)
        raise RuntimeError(f"paged_mqa_logits: no backend can serve {problem.describe()} ({details})")

    def _failure(self, problem: Problem, target: Target, name: str, config: dict, revisits: list) -> str | None:
        """Why a failed launch rules this choice out (``None``: it did not fail, or its
        transient failure's pause is over); notes in ``revisits`` when a pause ends."""
        key = (problem, target, name, knobs_key(config))
        reason = self._failed.get(key)
        if reason is not None and key in self._retry:
            retry_at = self._retry[key][0]
            if self.clock() >= retry_at:
                return None
            revisits.append(retry_at)
        return reason

    def record_failure(self, problem: Problem, choice: Choice, error: BaseException,
                       target: Target | None = None) -> None:
        """``choice`` raised ``error`` when launched on ``target``: log one warning, forget the
        cached decision so the next one falls back, and do not choose it again for ``problem``
        there: never, or, for a transient error (:data:`TRANSIENT_ERRORS`), not before a pause
        that doubles while it keeps failing (:data:`RETRY_PAUSE_S` up to :data:`MAX_RETRY_PAUSE_S`)."""
        target = resolve_target(problem, target)
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        reason = f"launch failed ({type(error).__name__}: {first_line})"
        key = (problem, target, choice.backend, knobs_key(choice.config))
        with self._lock:
            self._failed[key] = reason
            if isinstance(error, TRANSIENT_ERRORS):
                pause = min(MAX_RETRY_PAUSE_S, 2 * self._retry[key][1]) if key in self._retry else RETRY_PAUSE_S
                self._retry[key] = (self.clock() + pause, pause)
            if self._cache.get((problem, target)) is choice:
                del self._cache[(problem, target)]
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(choice.config.items())) or "defaults"
        retried = f"tried again in {self._retry[key][1]:.0f} s" if key in self._retry else "not retried for this key"
        logger.warning("%s [%s] failed for %s: %s: %s; falling back (%s)",
                       choice.backend, knobs, problem.describe(), type(error).__name__, first_line, retried)

    def decisions(self) -> dict[tuple[Problem, Target], Choice]:
        """A copy of the cached decisions, by (problem, target)."""
        with self._lock:
            return dict(self._cache)

    def failures(self) -> dict[tuple, str]:
        """``(problem, target, backend, knobs key) -> reason`` of every launch failure remembered."""
        with self._lock:
            return dict(self._failed)

    def reset(self) -> None:
        """Forget cached decisions (not the launch failures: the same code would fail again)."""
        with self._lock:
            self._generation += 1
            self._cache.clear()

    def forget_failures(self) -> None:
        with self._lock:
            self._failed.clear()
            self._retry.clear()

    def reload_tuned_table(self) -> None:
        """Re-read the table source (for the configured tables: the files and the env var naming
        them), forget cached decisions and the remembered launch failures (so a fixed toolchain
        is tried again)."""
        self.tables.reset()
        self.reset()
        self.forget_failures()


#: the dispatcher of the op and the tooling: the package's registry, the configured tables
DEFAULT = Dispatcher()


# Module functions: the default dispatcher's methods, for the op and the tooling.
def choose(problem: Problem, target: Target | None = None) -> Choice:
    """:meth:`Dispatcher.choose` of :data:`DEFAULT`."""
    return DEFAULT.choose(problem, target)


def decide(problem: Problem, backends: registry.Registry | None = None, target: Target | None = None) -> Choice:
    """:meth:`Dispatcher.decide` of :data:`DEFAULT`; with ``backends`` (a registry), of a
    dispatcher over those backends with the default's tables and fallback chain."""
    if backends is None:
        return DEFAULT.decide(problem, target)
    return Dispatcher(backends, DEFAULT.tables, DEFAULT.fallback_chain).decide(problem, target)


def fallback_chain(arch: str) -> tuple[str, ...]:
    """The fallback chain :data:`DEFAULT` uses for ``arch``."""
    return DEFAULT.fallback_chain(arch)


def record_failure(problem: Problem, choice: Choice, error: BaseException, target: Target | None = None) -> None:
    DEFAULT.record_failure(problem, choice, error, target)


def decisions() -> dict[tuple[Problem, Target], Choice]:
    return DEFAULT.decisions()


def failures() -> dict[tuple, str]:
    return DEFAULT.failures()


def reset() -> None:
    DEFAULT.reset()


def forget_failures() -> None:
    DEFAULT.forget_failures()


def reload_tuned_table() -> None:
    """Re-read the table files (and the env var naming them), forget :data:`DEFAULT`'s cached
    decisions and remembered launch failures (so a fixed toolchain is tried again)."""
    DEFAULT.reload_tuned_table()
