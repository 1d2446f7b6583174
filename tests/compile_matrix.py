"""The two sizes of a cross-compile matrix: the default test run compiles a covering sample (every
value of every knob at least once, and every combination of the knobs named together), the slow
set (``python -m pytest -q -m slow tests``) the whole matrix.

A matrix module parametrises its ``compiled`` fixture with :data:`SIZES` and passes its configs
through :func:`of_size`."""

from __future__ import annotations

import pytest

#: fixture params: the sample in the default run, the whole matrix in the slow set
SIZES = (pytest.param("sample", id="sample"), pytest.param("full", id="full", marks=pytest.mark.slow))


def covering_sample(configs: list, knobs_of=lambda config: config, together=()) -> list:
    """The configs, in order, that each bring a ``(knob, value)`` pair (or a combination of the
    knobs of one ``together`` tuple) not brought by an earlier one. ``knobs_of`` maps a config to
    its knob dict (the config itself by default)."""
    seen, sample = set(), []
    for config in configs:
        knobs = knobs_of(config)
        features = {(k, repr(v)) for k, v in knobs.items()}
        features |= {(names, repr(tuple(knobs.get(n) for n in names))) for names in together}
        if features - seen:
            seen |= features
            sample.append(config)
    return sample


def of_size(configs: list, size: str, **kwargs) -> list:
    return list(configs) if size == "full" else covering_sample(configs, **kwargs)


def for_archs(archs) -> list:
    """Fixture params ``(arch, size)`` for matrices compiled per arch."""
    return [pytest.param((arch, size.values[0]), id=f"{arch}-{size.id}", marks=size.marks)
            for arch in archs for size in SIZES]
