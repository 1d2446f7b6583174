"""Problem key -> (backend, knobs): the table lookup, per-arch defaults and the fallback chain.

A backend that cannot serve a call (unsupported shape, package missing, wrong arch) is
skipped down the arch's fallback chain. Every backend implements the same contract, so a
fallback changes speed, never the output. Decisions are cached per :class:`Problem`; with
``AITER_LOG_TUNED_CONFIG=1`` (or ``PAGED_MQA_LOGITS_LOG_TUNED_CONFIG=1``) each new key logs one
line saying which row or rule was used, from which file.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

from . import backends, table
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


def _log_enabled() -> bool:
    return any(os.environ.get(name, "0") not in ("", "0") for name in LOG_ENV)


def choose(problem: Problem) -> Choice:
    """Cached: the backend and knobs that serve ``problem``."""
    choice = _CACHE.get(problem)
    if choice is None:
        choice = _decide(problem)
        _CACHE[problem] = choice
        if _log_enabled():
            if not logger.handlers and not logging.getLogger().handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("[paged_mqa_logits] %(message)s"))
                logger.addHandler(handler)
                logger.setLevel(logging.INFO)
            logger.info("%s -> %s", problem.describe(), choice.describe())
    return choice


def _decide(problem: Problem) -> Choice:
    match = table.lookup(problem)
    skipped: list[tuple[str, str]] = []
    if match.row is not None:
        reason = backends.why_not(match.row.backend, problem)
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
            return Choice(name, backends.get(name).default_config(problem), rule, "defaults", skipped)
        skipped.append((name, reason))
    details = "; ".join(f"{n}: {r}" for n, r in skipped)
    raise RuntimeError(f"paged_mqa_logits: no backend can serve {problem.describe()} ({details})")


def reset() -> None:
    _CACHE.clear()


def reload_tuned_table() -> None:
    """Re-read the table files (and the env var naming them) and forget cached decisions."""
    table.reset()
    reset()
