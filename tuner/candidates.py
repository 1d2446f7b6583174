"""Which backends and knob sets the tuner tries for a key.

Every registered backend whose ``why_not(problem)`` is ``None`` at all of the key's contexts
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
from paged_mqa_logits.arch import native_fp8
from paged_mqa_logits.problem import Problem

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


@dataclass(frozen=True)
class Target:
    """The device being tuned for (or, for ``--dry-run``, described)."""

    arch: str
    cu_num: int
    device_type: str  # "cuda" or "cpu"
    hypothetical: bool = False  # described, not present: backends judge arch and shapes only

    def problem(self, key: TuneKey, context: int | None) -> Problem:
        return Problem(
            arch=self.arch, cu_num=self.cu_num, batch=key.batch, next_n=key.next_n, heads=key.heads,
            head_dim=key.head_dim, kv_block_size=key.kv_block_size, preshuffle=key.preshuffle, context=context,
            lens_2d=True, fp8=native_fp8(self.arch), device_type=self.device_type,
            max_model_len=context or max(key.contexts), hypothetical=self.hypothetical,
        )


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


def _spread(items: list, limit: int, keep: list) -> list:
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
        problems = [target.problem(key, c) for c in key.contexts]
        reason = next((r for r in (backends.why_not(name, p) for p in problems) if r), None)
        if reason:
            skipped[name] = reason
            continue
        backend = backends.get(name)
        default = Candidate.of(name, backend.default_config(problems[-1]))
        found = [Candidate.of(name, c) for p in problems for c in backend.candidates(p)]
        found = list(dict.fromkeys(found + [default]))
        chosen += _spread(found, max_candidates, [default])
    return chosen, skipped
