"""Which backends and knob sets the tuner tries for a key.

Every registered backend whose ``why_not(problem, target)`` is ``None`` at all of the key's contexts
serves the key; its candidates are the union of ``candidates(problem)`` over the contexts plus
its ``default_config`` (so the tuned pick is always compared with what an untuned table runs).

``PAGED_MQA_LOGITS_EXTRA_BACKENDS=module:attr[,module:attr]`` adds backends that are not in the
package's registry (test backends that crash or hang on purpose, out-of-tree experiments); the
tuner's worker processes import them too. Their name is the object's ``name``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from paged_mqa_logits import backends
from paged_mqa_logits.problem import Problem, Target

from .keys import TuneKey

EXTRA_BACKENDS_ENV = "PAGED_MQA_LOGITS_EXTRA_BACKENDS"


def register_backend(backend, spec: str | None = None) -> None:
    """Add a backend object to the package's registry under ``backend.name``."""
    backends.register(backend.name, backend, spec)


def load_extra_backends() -> list[str]:
    """Register the backends named in ``$PAGED_MQA_LOGITS_EXTRA_BACKENDS``; returns their names."""
    names = []
    for spec in filter(None, (s.strip() for s in os.environ.get(EXTRA_BACKENDS_ENV, "").split(","))):
        module_name, _, attr = spec.partition(":")
        backend = getattr(importlib.import_module(module_name), attr or "BACKEND")
        register_backend(backend, spec)
        names.append(backend.name)
    return names


def problem_for(key: TuneKey, target: Target, context: int | None) -> Problem:
    """The problem the tuner times ``key`` as on ``target`` (the device being tuned for, or for
    ``--dry-run`` one described) at ``context``."""
    return Problem.of(key.shape_key, target, context=context, max_model_len=context or max(key.contexts))


@dataclass(frozen=True)
class Candidate:
    backend: str
    config: tuple  # sorted (knob, value) pairs

    @staticmethod
    def of(backend: str, config: dict) -> "Candidate":
        return Candidate(backend, tuple(sorted((k, v) for k, v in config.items() if v is not None)))

    @property
    def knobs(self) -> dict:
        return dict(self.config)

    @property
    def label(self) -> str:
        return f"{self.backend}[" + (";".join(f"{k}={v}" for k, v in self.config) or "default") + "]"


def spread(items: list, limit: int, keep: list) -> list:
    """At most ``limit`` items, evenly spaced over the list, always including ``keep``."""
    if limit <= 0 or len(items) <= limit:
        return items
    room = max(limit - len(keep), 0)
    picked = [items[round(i * (len(items) - 1) / max(room - 1, 1))] for i in range(room)] if room else []
    return list(dict.fromkeys(keep + picked))


def candidates_for(key: TuneKey, target: Target, names: list[str] | None = None,
                   max_candidates: int = 0) -> tuple[list[Candidate], dict[str, str]]:
    """``(candidates, {backend: why it cannot serve})`` for ``key`` on ``target``.

    Without ``names``: every registered backend, except ``torch`` on a GPU (the reference-speed
    fallback never wins there, and timing it at long contexts costs seconds per shape).
    """
    chosen: list[Candidate] = []
    skipped: dict[str, str] = {}
    if names is None:
        names = [n for n in backends.names() if n != "torch" or target.device_type == "cpu"]
    for name in names:
        problems = [problem_for(key, target, c) for c in key.contexts]
        reason = next((r for r in (backends.why_not(name, p, target) for p in problems) if r), None)
        if reason:
            skipped[name] = reason
            continue
        backend = backends.get(name)
        default = Candidate.of(name, backend.default_config(problems[-1]))
        found = [Candidate.of(name, c) for p in problems for c in backend.candidates(p)]
        found = list(dict.fromkeys(found + [default]))
        chosen += spread(found, max_candidates, [default])
    return chosen, skipped
