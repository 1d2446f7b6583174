"""Honest footprint: rotating input copies of one shape, each its own ``make_inputs`` call (every
sequence's blocks its own, placed by a random permutation), enough of them to pass L2; and the byte /
FLOP accounting every figure is computed from.

The copies are sized to the device: as many as fit its free memory (:func:`free_memory`:
``torch.cuda.mem_get_info`` on a GPU, the host's available memory on CPU, capped by
``PAGED_MQA_LOGITS_MEMORY_LIMIT`` bytes when set, to leave room for another process); a shape of
which not even one copy fits raises :class:`ShapeDoesNotFit`, which the bench and the tuner
report as skipped, not failed."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from ..arch import detect, native_fp8_dtype
from ..errors import PagedMQAEnvironmentError
from ..problem import LOGITS_DTYPES, LaunchArgs, token_bytes
from ..reference import KEY_CHUNK_ELEMENTS, logits_into, make_inputs
from ..validate import build_launch_args
from .environment import l2_bytes
from .shapes import Shape

MIN_WORKING_SET = 512 << 20
ENV_MEMORY_LIMIT = "PAGED_MQA_LOGITS_MEMORY_LIMIT"
#: the share of the free memory the copies may take; the rest is the allocator's and the timing's
USABLE_FRACTION = 0.8
#: copies' worth of room beside the copies: the reference and the check's output
ROOM_COPIES = 3
#: the status the bench and the tuner give every implementation of a shape that does not fit
SKIPPED_FOR_MEMORY = "skipped: too large: "


class ShapeDoesNotFit(MemoryError):
    """Not even one copy of a shape's inputs fits the free memory: the shape is skipped."""

    def __init__(self, shape: Shape, needed: int, free: int):
        self.shape, self.needed, self.free = shape, needed, free
        super().__init__(f"{shape.describe()}: does not fit: needs {needed / 2**30:.1f} GiB free ({needed} bytes: "
                         f"one copy of the inputs while building it and room for the reference and the check), "
                         f"{free / 2**30:.1f} GiB free ({free} bytes)")


def _memory_limit() -> int | None:
    text = os.environ.get(ENV_MEMORY_LIMIT, "").strip()
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise PagedMQAEnvironmentError(f"paged_mqa_logits: environment variable {ENV_MEMORY_LIMIT}: expected a "
                                       f"positive number of bytes, got {text!r}")
    return int(text)


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_memory(dev: torch.device) -> int | None:
    """Bytes free for the inputs on ``dev`` (see the module docstring); ``None`` when unknown."""
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else _host_available()
    limit = _memory_limit()
    if limit is not None:
        free = limit if free is None else min(free, limit)
    return free


@dataclass
class Accounting:
    """What one call must do, from the host-side lengths (never read from the device)."""

    visible: int  # (row, key) pairs written
    kv_bytes: int  # keys + scales of the tokens every sequence walks (132 a token in fp8, 68 in fp4)
    logits_bytes: int  # 4 a logit in fp32, 2 in bf16

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.logits_bytes

    def flops(self, heads: int, head_dim: int) -> int:
        return 2 * heads * head_dim * self.visible


def accounting(shape: Shape, lens: list[int], max_model_len: int, max_blocks: int) -> Accounting:
    """Row ``(b, j)`` sees ``min(max(L_b - next_n + j + 1, 0), max_model_len, max_blocks*kv_block_size)``
    positions (problem.py); sequence ``b`` walks the longest of its rows."""
    key = shape.shape_key
    width = min(max_model_len, max_blocks * key.kv_block_size)
    visible = walked = 0
    for length in lens:
        rows = [min(max(length - key.next_n + j + 1, 0), width) for j in range(key.next_n)]
        visible += sum(rows)
        walked += max(rows)
    logit_size = LOGITS_DTYPES[key.logits_dtype].itemsize
    return Accounting(visible, walked * token_bytes(key.head_dim, key.kv_format), visible * logit_size)


def _copy_footprint(shape: Shape, lens: list[int]) -> tuple[int, int]:
    """``(persistent bytes of one copy, transient peak while building one)``.
    make_inputs draws float32 keys and quantises them out of place, ~16 bytes per element of a
    chunk of ``KEY_CHUNK_ELEMENTS``, beside the quantised keys it packs into the cache."""
    key = shape.shape_key
    blocks = sum(math.ceil(n / key.kv_block_size) for n in lens)
    key_elems = blocks * key.kv_block_size * key.head_dim
    logit_size = LOGITS_DTYPES[key.logits_dtype].itemsize
    persistent = (blocks * key.kv_block_size * token_bytes(key.head_dim, key.kv_format)
                  + key.batch * key.next_n * (max(lens) + 8) * logit_size)
    return persistent, 16 * min(key_elems, KEY_CHUNK_ELEMENTS) + key_elems


@dataclass
class Workload:
    """Rotating input copies of one shape on one device, with their validated launch arguments."""

    shape: Shape
    device: torch.device
    inputs: list[dict]
    args: list[LaunchArgs]
    lens: list[int]
    accounting: Accounting
    context_hint: int | None
    _reference: torch.Tensor | None = field(default=None, repr=False)

    @property
    def copies(self) -> int:
        return len(self.args)

    @property
    def working_set_bytes(self) -> int:
        return self.copies * (self.accounting.bytes)

    def with_hint(self, context_hint: int | None) -> "Workload":
        """The same copies, validated again with another host ``context_hint`` (cheap: no
        tensor is rebuilt; the reference is shared)."""

        if context_hint == self.context_hint:
            return self
        return self._revalidated(context_hint, clean_logits=False)

    def cleaning(self) -> "Workload":
        """The same copies, validated again as calls with ``clean_logits`` (cheap, as :meth:`with_hint`)."""
        return self._revalidated(self.context_hint, clean_logits=True)

    def _revalidated(self, context_hint: int | None, clean_logits: bool) -> "Workload":
        args = [_launch_args(inp, context_hint, clean_logits) for inp in self.inputs]
        self.reference()
        return Workload(self.shape, self.device, self.inputs, args, self.lens, self.accounting, context_hint,
                        self._reference)

    def reference(self) -> torch.Tensor:
        """Reference logits of copy 0 (``-inf`` where not visible); computed once."""
        if self._reference is None:

            inp = self.inputs[0]
            key = self.shape.shape_key
            rows = key.batch * key.next_n
            ref = torch.full((rows, inp["max_model_len"]), float("-inf"), dtype=inp["out_logits"].dtype,
                             device=self.device)
            # Big column chunks on a GPU: the reference is not what is being timed.
            logits_into(ref, inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                        inp["max_model_len"], kv_block_size=key.kv_block_size, preshuffle=key.preshuffle,
                        max_elements=(1 << 28) if self.device.type == "cuda" else (1 << 25), q_scale=inp["q_scale"])
            self._reference = ref
        return self._reference


def _launch_args(inp: dict, context_hint: int | None, clean_logits: bool = False) -> LaunchArgs:
    """The validated call of one input copy (``make_inputs``' dict) with ``context_hint``."""
    return build_launch_args(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"],
                             inp["kv_indices"], inp["max_model_len"], inp["preshuffle"], inp["kv_block_size"],
                             context_hint=context_hint, q_scale=inp["q_scale"], clean_logits=clean_logits)


def build_workload(shape: Shape, device: str | torch.device = "cpu", *, copies: int | None = None,
                   max_copies: int = 256, working_set: int | None = None, seed: int = 0,
                   context_hint: int | None | str = "context", arch: str | None = None) -> Workload:
    """Rotating copies of ``shape`` (see the module docstring for how many).

    ``context_hint="context"`` passes the shape's context as the host hint, as engines that know
    the step's longest context do; ``None`` leaves it out (the table's ``any`` rows serve).
    """

    dev = torch.device(device)
    arch = arch or detect(dev).arch
    lens = shape.lens(seed)
    per_copy, transient = _copy_footprint(shape, lens)
    if copies is None:
        if dev.type == "cuda":
            target = working_set or max(4 * l2_bytes(dev), MIN_WORKING_SET)
            copies = min(max(2, math.ceil(target / max(per_copy, 1))), max_copies)
        else:
            copies = 1  # CPU: the loop is for tests and accounting, not for bandwidth
    free = free_memory(dev)
    if free is not None:
        budget = int(USABLE_FRACTION * free) - transient - ROOM_COPIES * per_copy
        fits = budget // max(per_copy, 1)
        if fits < 1:
            needed = math.ceil((transient + (ROOM_COPIES + 1) * per_copy) / USABLE_FRACTION)
            raise ShapeDoesNotFit(shape, needed, free)
        copies = max(1, min(copies, fits))
    hint = shape.context if context_hint == "context" else context_hint
    inputs, args = [], []
    key = shape.shape_key
    for i in range(copies):
        inp = make_inputs(key.batch, key.next_n, key.heads, lens, kv_block_size=key.kv_block_size,
                          preshuffle=key.preshuffle, fp8_dtype=native_fp8_dtype(arch), lens_2d=shape.lens_2d,
                          max_model_len=max(lens), device=dev, seed=seed + i, head_dim=key.head_dim,
                          kv_format=key.kv_format, logits_dtype=LOGITS_DTYPES[key.logits_dtype])
        inputs.append(inp)
        args.append(_launch_args(inp, hint))
    acc = accounting(shape, lens, inputs[0]["max_model_len"], inputs[0]["kv_indices"].shape[1])
    return Workload(shape, dev, inputs, args, lens, acc, hint)
