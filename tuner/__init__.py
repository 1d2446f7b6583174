"""Offline tuner for paged_mqa_logits' tuned tables.

``python -m tuner UNTUNED.csv... --out TABLE.csv`` from a checkout (installed:
``python -m paged_mqa_logits.tuner``, console script ``paged-mqa-logits-tune``)
times every candidate of every backend that can serve each key on the current GPU with the
bench method and writes the tuned table; ``python -m tuner recheck --table TABLE.csv`` re-times
a table's picks through the production dispatch and reports drift and regressions.
docs/TUNING.md is the operator's guide.

Modules: :mod:`~tuner.keys` (untuned key lists), :mod:`~tuner.candidates` (what is tried),
:mod:`~tuner.worker` (crash- and hang-isolated worker processes), :mod:`~tuner.search` (the run:
check/compile, screen/confirm timing, time budget), :mod:`~tuner.writer` (picks, provenance,
atomic merge), :mod:`~tuner.recheck`.
"""

from .recheck import classify, recheck
from .search import Options, Outcome, tune

__all__ = ["tune", "Options", "Outcome", "recheck", "classify"]
