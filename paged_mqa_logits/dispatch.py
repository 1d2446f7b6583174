"""Problem key -> (backend, knobs): the table lookup, per-arch defaults and the fallback chain.

A backend that cannot serve a call (unsupported shape, package missing, wrong arch) is
skipped down the arch's fallback chain. Every backend implements the same contract, so a
fallback changes speed, never the output. Decisions are cached per :class:`Problem`; with
``AITER_LOG_TUNED_CONFIG=1`` (or ``PAGED_MQA_LOGITS_LOG_TUNED_CONFIG=1``) each new key logs one
line saying which row or rule was used, from which file.

A choice whose launch raised (a compile or launch error) is reported to :func:`record_failure`
by the op: it logs one warning, remembers ``(problem, backend, knobs)`` so that choice is never
made again in this process, and the next decision for the key falls down the chain. Only
decisions made from a fully loaded table are cached, and a decision that raced a
:func:`reset` is not cached.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field

from . import table
from .backends import registry
from .problem import Problem

LOG_ENV = ("AITER_LOG_TUNED_CONFIG", "PAGED_MQA_LOGITS_LOG_TUNED_CONFIG")
logger = logging.getLogger("paged_mqa_logits")


def fallback_chain(arch: str) -> tuple[str, ...]:
    """Backends tried, in order, after the table's pick (or as the defaults)."""
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

    def describe(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(self.config.items())) or "defaults"
        text = f"backend={self.backend} [{knobs}] rule: {self.rule} (from {self.source})"
        for name, why in self.skipped:
            text += f"; skipped {name}: {why}"
        return text


_CACHE: dict[Problem, Choice] = {}
#: (problem, backend, knobs key) -> the error its launch raised
_FAILED: dict[tuple, str] = {}
_LOCK = threading.Lock()
_GENERATION = 0  # bumped by reset(): a decision begun before it is not cached


def _log_enabled() -> bool:
    return any(os.environ.get(name, "0") not in ("", "0") for name in LOG_ENV)


def knobs_key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items() if v is not None))


def choose(problem: Problem) -> Choice:
    """Cached: the backend and knobs that serve ``problem``."""
    choice = _CACHE.get(problem)
    if choice is None:
        generation = _GENERATION
        choice = decide(problem)  # loads the table (under its lock) before looking anything up
        with _LOCK:
            if generation != _GENERATION:
                return choice
            if problem in _CACHE:  # another thread decided first: one decision per key
                return _CACHE[problem]
            _CACHE[problem] = choice
        if _log_enabled():
            _ensure_log_handler()
            logger.info("%s -> %s", problem.describe(), choice.describe())
    return choice


def _ensure_log_handler() -> None:
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[paged_mqa_logits] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def _failed(problem: Problem, name: str, config: dict) -> str | None:
    return _FAILED.get((problem, name, knobs_key(config)))


def decide(problem: Problem, backends: registry.Registry = registry.DEFAULT) -> Choice:
    """The decision for ``problem``, made now and not cached (:func:`choose` caches it):
    the table's row if its backend (from ``backends``, the registry) can serve, else the first
    link of the arch's fallback chain that can."""
    match = table.lookup(problem)
    skipped: list[tuple[str, str]] = []
    if match.row is not None:
        reason = backends.why_not(match.row.backend, problem) or _failed(problem, match.row.backend, match.row.knobs)
        if reason is None:
            return Choice(match.row.backend, match.row.knobs, match.rule, match.row.source)
        skipped.append((match.row.backend, reason))
        rule = f"fallback: table row {match.row.source} names {match.row.backend}, which cannot serve"
    else:
        rule = f"default for {problem.arch} ({match.rule})"
    for name in fallback_chain(problem.arch):
        if any(name == s for s, _ in skipped):
            continue
        reason = backends.why_not(name, problem)
        if reason is None:
            config = backends.get(name).default_config(problem)
            reason = _failed(problem, name, config)
            if reason is None:
                return Choice(name, config, rule, "defaults", skipped)
        skipped.append((name, reason))
    details = "; ".join(f"{n}: {r}" for n, r in skipped)
    raise RuntimeError(f"paged_mqa_logits: no backend can serve {problem.describe()} ({details})")


def record_failure(problem: Problem, choice: Choice, error: BaseException) -> None:
    """``choice`` raised ``error`` when launched: log one warning, never choose it again for
    ``problem`` in this process, and forget the cached decision so the next falls back."""
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    reason = f"launch failed ({type(error).__name__}: {first_line})"
    with _LOCK:
        _FAILED[(problem, choice.backend, knobs_key(choice.config))] = reason
        if _CACHE.get(problem) is choice:
            del _CACHE[problem]
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(choice.config.items())) or "defaults"
    logger.warning("%s [%s] failed for %s: %s: %s; falling back (not retried for this key)",
                   choice.backend, knobs, problem.describe(), type(error).__name__, first_line)


def failures() -> dict[tuple, str]:
    """``(problem, backend, knobs key) -> reason`` of every launch failure remembered."""
    return dict(_FAILED)


def reset() -> None:
    """Forget cached decisions (not the launch failures: the same code would fail again)."""
    global _GENERATION
    with _LOCK:
        _GENERATION += 1
        _CACHE.clear()


def forget_failures() -> None:
    _FAILED.clear()


def reload_tuned_table() -> None:
    """Re-read the table files (and the env var naming them), forget cached decisions and the
    remembered launch failures (so a fixed toolchain is tried again)."""
    table.reset()
    reset()
    forget_failures()
