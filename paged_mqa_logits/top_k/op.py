"""The top-k op as a registered torch operator, ``torch.ops.paged_mqa_logits.topk``, and its
public entry point :func:`topk`.

The op writes ``out`` in place and returns nothing (``torch.compile`` functionalises it); its
fake writes nothing. Validation runs in the real implementation before anything is written;
nothing on the path reads a device value, so the call can be captured in a CUDA graph."""

from __future__ import annotations

import torch

from ..torch_op import NAMESPACE
from ..validate import fail
from .backends import BACKENDS, choose, launcher
from .validate import TopkCall, check_call

SCHEMA = ("topk(Tensor logits, Tensor lengths, int next_n, int k, Tensor(a!) out, Tensor? block_table=None, "
          "int block_size=1, str? backend=None) -> ()")


#: ``next_n`` across the schema when the caller left it to the lengths (``None`` in Python)
NO_NEXT_N = -1


def check_backend(backend) -> None:
    """``backend`` is ``None`` or one of :data:`BACKENDS` (an error naming ``backend`` otherwise)."""
    if backend is not None and backend not in BACKENDS:
        fail("backend", "None or one of " + ", ".join(map(repr, BACKENDS)), repr(backend))


def launch(call: TopkCall, backend: str | None = None) -> None:
    """Select a validated call's rows into ``call.out`` with ``backend`` (checked by
    :func:`check_backend`; ``None``: the tuned tables' pick); reads no device value."""
    choice = choose(call, backend)
    launcher(choice.backend)(call, choice.config)


def run(logits, lengths, next_n, k, out, block_table=None, block_size=1, backend=None) -> torch.Tensor:
    """Validate and launch one call (the op's implementation, every device); returns ``out``."""
    check_backend(backend)
    launch(check_call(logits, lengths, next_n, k, out, block_table, block_size), backend)
    return out


def _implementation(logits, lengths, next_n, k, out, block_table=None, block_size=1, backend=None) -> None:
    next_n = None if next_n == NO_NEXT_N else next_n
    run(logits, lengths, next_n, k, out, block_table, block_size, backend)


def _fake(logits, lengths, next_n, k, out, block_table=None, block_size=1, backend=None) -> None:
    return None


# A fragment of the logits op's namespace: the library that defines the namespace is torch_op's.
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIB.define(SCHEMA)
_LIB.impl("topk", _implementation, "CompositeExplicitAutograd")
torch.library.register_fake(f"{NAMESPACE}::topk", _fake, lib=_LIB)
op = torch.ops.paged_mqa_logits.topk.default


def topk(logits: torch.Tensor, lengths: torch.Tensor, k: int = 2048, *, next_n: int | None = None,
         out: torch.Tensor | None = None, block_table: torch.Tensor | None = None, block_size: int = 1,
         backend: str | None = None) -> torch.Tensor:
    """Positions of the ``k`` largest visible logits of each row (docs/TOPK.md), int32 ``[rows, k]``.

    ``logits``: fp32 (or bf16) ``[batch * next_n, width]``, any row and column stride.
    ``lengths``: int32 ``[batch]`` (row ``j`` of sequence ``b`` sees positions ``p <= L_b - next_n + j``;
    ``next_n`` defaults to 1) or ``[batch, next_n]`` (row ``j`` sees ``p < lens[b, j]``).
    ``out``: where to write (allocated when ``None``). ``block_table``/``block_size``: write
    ``block_table[b, p // block_size] * block_size + p % block_size`` instead of ``p``.
    ``backend``: one of :data:`BACKENDS` (default: the tuned tables' pick, else torch on CPU and
    triton_sample on GPUs; ``top_k/backends.py``).
    Each row holds its positions unsorted; a row with fewer than ``k`` visible positions holds all
    of them, then ``-1``.
    """
    if out is None:
        if not isinstance(logits, torch.Tensor):
            fail("logits", "a torch.Tensor", type(logits).__name__)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            fail("k", "an int >= 1", repr(k))
        out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
    if torch.compiler.is_compiling() or type(out) is not torch.Tensor or torch._C._len_torch_dispatch_stack() > 0:
        op(logits, lengths, NO_NEXT_N if next_n is None else next_n, k, out, block_table, block_size, backend)
        return out
    return run(logits, lengths, next_n, k, out, block_table, block_size, backend)
