"""The knobs of each top-k backend: their allowed values, defaults and tuning candidates.

The one home of the kernels' launch parameters (``triton_portable.py``, ``triton_radix.py`` and
``triton_sample.py`` read their defaults from here); importing it imports no Triton, so tables and
``explain`` work without it.

* ``BLOCK``: elements one step of a pass reads (a power of two). The portable kernel compares
  ``[BLOCK, 16]`` per search round; the radix kernel histograms ``BLOCK`` keys a step; the sample
  kernel's compaction reads ``BLOCK`` keys a step as ``BLOCK / (128 num_warps)`` stripes of
  ``128 num_warps`` columns (its list search and fallback step over ``128 num_warps``).
* ``num_warps``: warps (waves) per program, GPUs only (the interpreter ignores it).
* ``split`` (``triton_radix``, ``triton_sample``): chunks each row is cut into (over four launches,
  over two); absent: the kernel's own rule (``triton_radix.split_for``: split only when the rows
  leave SMs idle). ``triton_sample`` never splits a call whose rows it holds whole (no wider than
  ``BLOCK`` and ``HELD_ROW``), so the tuner does not time split values there.

Defaults differ between GPUs and CPU tensors (the interpreter runs small blocks faster) and, for
``triton_sample``, between calls whose rows outnumber the GPU's SMs and the rest: with a row a
program, more rows than SMs leave no SM idle, and smaller programs (``BLOCK`` 2048 over 4 warps:
fewer registers, so several an SM) hide each other's latency, where a lone program an SM needs the
larger block's fewer steps. On an H100 (``benchmarks/h100/topk_sample_ab.csv``, same run): 1.09-1.42x
at 256-1024 rows of 8k-32k, 1.01x at 256 rows of 128k; at 64 rows it lost (0.69-0.78x).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KnobSpace:
    """One backend's knobs: allowed values, defaults and tuning candidates per device kind."""

    allowed: dict = field(default_factory=dict)  # knob -> allowed values
    gpu: dict = field(default_factory=dict)  # defaults on a GPU
    gpu_many_rows: dict | None = None  # defaults on a GPU when the rows outnumber its SMs (None: ``gpu``)
    cpu: dict = field(default_factory=dict)  # defaults for CPU tensors (the interpreter)
    #: knob -> values tried by the tuner (on top of the defaults), per device kind
    tune_gpu: dict = field(default_factory=dict)
    tune_cpu: dict = field(default_factory=dict)


_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
_WARPS = (1, 2, 4, 8, 16)
#: the most chunks the radix kernel splits a row into (a power of two), and the ``split`` values
#: it takes
MAX_SPLIT = 16
SPLITS = tuple(2**i for i in range(MAX_SPLIT.bit_length()))
#: the longest row (visible positions) selected whole in registers, when the block allows: one read, no
#: sample and no list (at most 65535: the ranks' packed scan)
HELD_ROW = 8192

SPACES = {
    "torch": KnobSpace(),
    "triton": KnobSpace(
        allowed={"BLOCK": _BLOCKS, "num_warps": _WARPS},
        gpu={"BLOCK": 512, "num_warps": 4}, cpu={"BLOCK": 64},
        tune_gpu={"BLOCK": (256, 512, 1024), "num_warps": (4, 8)}, tune_cpu={"BLOCK": (32, 64)}),
    "triton_radix": KnobSpace(
        allowed={"BLOCK": _BLOCKS, "num_warps": _WARPS, "split": SPLITS},
        gpu={"BLOCK": 1024, "num_warps": 8}, cpu={"BLOCK": 64},
        tune_gpu={"BLOCK": (512, 1024, 2048), "num_warps": (4, 8, 16), "split": (None,) + SPLITS},
        tune_cpu={"BLOCK": (64,), "split": (None, 1, 2)}),
    "triton_sample": KnobSpace(
        allowed={"BLOCK": _BLOCKS + (8192,), "num_warps": _WARPS, "split": SPLITS},
        gpu={"BLOCK": 8192, "num_warps": 8}, gpu_many_rows={"BLOCK": 2048, "num_warps": 4}, cpu={"BLOCK": 64},
        tune_gpu={"BLOCK": (2048, 4096, 8192), "num_warps": (4, 8), "split": (None,) + SPLITS},
        tune_cpu={"BLOCK": (64,), "split": (None, 1, 2)}),
}
#: every top-k knob name: a column a table may have
KNOB_NAMES = tuple(dict.fromkeys(k for space in SPACES.values() for k in space.allowed))


def many_rows(backend: str, on_cpu: bool, rows: int | None, sms: int | None) -> bool:
    """Whether ``backend``'s many-rows defaults apply: a GPU, ``rows`` and ``sms`` given, more rows than SMs,
    and the backend has them."""
    return (not on_cpu and SPACES[backend].gpu_many_rows is not None and rows is not None and sms is not None
            and rows > sms)


def default_config(backend: str, on_cpu: bool, rows: int | None = None, sms: int | None = None) -> dict:
    """``backend``'s default knobs for CPU tensors or a GPU; on a GPU of ``sms`` SMs/CUs, for ``rows``
    rows (both given: the many-rows defaults where :func:`many_rows`)."""
    space = SPACES[backend]
    if on_cpu:
        return dict(space.cpu)
    return dict(space.gpu_many_rows if many_rows(backend, on_cpu, rows, sms) else space.gpu)


def check_config(backend: str, knobs: dict) -> str | None:
    """Why ``knobs`` are no config of ``backend`` (names the knob, the allowed and the given
    value), ``None`` when they are one."""
    allowed = SPACES[backend].allowed
    for name, value in sorted(knobs.items()):
        if name not in allowed:
            return (f"knob {name} is no knob of top-k backend {backend} (its knobs: "
                    f"{', '.join(allowed) or 'none'}), got {name}={value!r}")
        if value not in allowed[name]:
            return f"knob {name} of top-k backend {backend} must be one of {allowed[name]}, got {value!r}"
    return None


def candidates(backend: str, on_cpu: bool, rows: int, width: int, sms: int) -> list[dict]:
    """The configs the tuner times for ``rows`` rows of ``width`` columns on a chip of ``sms``
    SMs/CUs: the product of the tuning values, the defaults first; ``split`` only where it
    leaves chunks of at least 64 columns and, on a GPU, where the rows leave SMs idle."""
    space = SPACES[backend]
    values = dict(space.tune_cpu if on_cpu else space.tune_gpu)
    if "split" in values:
        values["split"] = tuple(s for s in values["split"]
                                if s is None or (width // s >= 64 and (on_cpu or s == 1 or rows * s <= 2 * sms)))
    default = default_config(backend, on_cpu, rows, sms)
    configs = [default]
    for name, options in values.items():
        configs = [dict(c, **{name: v}) if v is not None else {k: x for k, x in c.items() if k != name}
                   for c in configs for v in options]
    if backend == "triton_sample":  # rows held whole run split 1 whatever is asked: one config, not several
        configs = [c for c in configs if "split" not in c or width > min(HELD_ROW, c["BLOCK"])]
    return list({tuple(sorted(c.items())): c for c in [default] + configs}.values())
