"""The measuring method (docs/BENCHMARK.md), shared by ``python -m paged_mqa_logits bench`` and
the tuner (``python -m tuner``).

Method, for one shape:

* **Honest footprint.** Every rotating copy of the inputs comes from its own
  :func:`~paged_mqa_logits.reference.make_inputs` call (every sequence's blocks its own, none
  shared, the block table filled from a random permutation). On a GPU there are enough copies that the
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

from .cli import main
from .deepgemm import DEEPGEMM_NEXT_N, deepgemm_available, deepgemm_flattens, deepgemm_runner, deepgemm_unsupported
from .environment import Environment, copy_bandwidth, environment
from .measure import (SENTINEL_BITS, SENTINEL_BITS_BF16, DeviceLost, Impl, Measurement, Schedule, Timing, check,
                      format_knobs, measure, parse_knobs, runners, time_calls)
from .report import COLUMNS, anchor_us, csv_row, geomean, load_anchor, print_table, summary, write_csv
from .shapes import DEFAULT_GRID, LENGTH_MODES, Shape, grid_shapes, shapes_from_csv
from .workload import MIN_WORKING_SET, SKIPPED_FOR_MEMORY, Accounting, ShapeDoesNotFit, Workload, accounting, build_workload, free_memory

__all__ = [
    "main", "DEEPGEMM_NEXT_N", "deepgemm_available", "deepgemm_flattens", "deepgemm_runner", "deepgemm_unsupported",
    "Environment", "copy_bandwidth", "environment", "SENTINEL_BITS", "SENTINEL_BITS_BF16", "DeviceLost", "Impl",
    "Measurement", "Schedule", "Timing", "check", "format_knobs", "measure", "parse_knobs", "runners", "time_calls",
    "COLUMNS", "anchor_us", "csv_row", "geomean", "load_anchor", "print_table", "summary", "write_csv",
    "DEFAULT_GRID", "LENGTH_MODES", "Shape", "grid_shapes", "shapes_from_csv", "MIN_WORKING_SET", "Accounting",
    "SKIPPED_FOR_MEMORY", "ShapeDoesNotFit", "Workload", "accounting", "build_workload", "free_memory",
]
