"""The op as a registered torch operator: ``torch.ops.paged_mqa_logits.paged_mqa_logits``.

Schema (``out_logits`` is mutated in place, nothing is returned, so ``torch.compile``
functionalises it with ``auto_functionalized`` and writes back into the caller's buffer)::

    paged_mqa_logits(Tensor q_fp8, Tensor kv_cache, Tensor weights, Tensor(a!) out_logits,
                     Tensor context_lens, Tensor kv_indices, SymInt max_model_len,
                     bool Preshuffle=False, int KVBlockSize=1, *, SymInt context_hint=-1,
                     bool clean_logits=False, str? backend=None, str? config=None) -> ()

``context_hint=-1`` stands for "no hint" (``None`` in Python); ``max_model_len`` and
``context_hint`` are ``SymInt`` so a compiled model does not recompile when the longest context
of the step changes; ``config`` is a JSON object of knobs (only with ``backend``).

The fake (meta) implementation writes nothing and returns nothing: the op's only output is the
in-place write. Validation runs in the real implementation, before anything is written.

:func:`paged_mqa_logits` here is the public entry point. It calls the registered op whenever
anything is tracing or intercepting torch calls (``torch.compile``/dynamo, ``make_fx``/export,
a ``TorchDispatchMode`` or ``TorchFunctionMode``, tensor subclasses such as FakeTensor); plain
eager calls take the direct path, which runs the very same implementation without the
dispatcher's ~3 us. Set ``PAGED_MQA_LOGITS_EAGER_VIA_OP=1`` (or :data:`EAGER_VIA_OP`) to route
eager calls through the op as well. Graph capture needs nothing special: the launch never
synchronises and compiles nothing once :func:`paged_mqa_logits.warmup` has run.
"""

from __future__ import annotations

import json
import os

import torch

from . import op as _op
from .errors import PagedMQAArgumentError, env_flag

NAMESPACE = "paged_mqa_logits"
OP_NAME = "paged_mqa_logits"
SCHEMA = (
    "paged_mqa_logits(Tensor q_fp8, Tensor kv_cache, Tensor weights, Tensor(a!) out_logits, "
    "Tensor context_lens, Tensor kv_indices, SymInt max_model_len, bool Preshuffle=False, "
    "int KVBlockSize=1, *, SymInt context_hint=-1, bool clean_logits=False, str? backend=None, "
    "str? config=None) -> ()"
)
NO_HINT = -1

#: route eager calls through the dispatcher too (tracing and modes always go through it)
EAGER_VIA_OP = env_flag("PAGED_MQA_LOGITS_EAGER_VIA_OP", os.environ.get("PAGED_MQA_LOGITS_EAGER_VIA_OP"))


def _impl(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle=False,
          KVBlockSize=1, *, context_hint=NO_HINT, clean_logits=False, backend=None, config=None) -> None:
    _op.paged_mqa_logits_eager(
        q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle, KVBlockSize,
        context_hint=None if context_hint == NO_HINT else context_hint, clean_logits=clean_logits,
        backend=backend, config=None if config is None else _config_from_json(config),
    )


def _config_from_json(text: str):
    """The ``config`` string of the ``torch.ops`` schema back to knobs (not a dict: the op's
    own check names it)."""
    try:
        return json.loads(text)
    except ValueError:
        raise PagedMQAArgumentError(f"paged_mqa_logits: argument `config`: expected a JSON object of knobs, "
                                    f"got {text!r}") from None


def _fake(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle=False,
          KVBlockSize=1, *, context_hint=NO_HINT, clean_logits=False, backend=None, config=None) -> None:
    return None


# A plain Library definition rather than @torch.library.custom_op: the latter's Python wrapper
# costs ~40 us per eager call on CPU, the plain dispatcher path ~3 us (measured, torch 2.13).
_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define(SCHEMA)
# CompositeExplicitAutograd: one kernel for every device (CPU, CUDA, ROCm); the backend picks
# the device-specific launch. No autograd formula: logits feed a top-k, not a backward pass.
_LIB.impl(OP_NAME, _impl, "CompositeExplicitAutograd")
torch.library.register_fake(f"{NAMESPACE}::{OP_NAME}", _fake, lib=_LIB)

op = getattr(getattr(torch.ops, NAMESPACE), OP_NAME).default


def _must_use_op(out_logits) -> bool:
    """True when a direct call would be invisible to whatever is watching torch calls."""
    return (
        EAGER_VIA_OP
        or type(out_logits) is not torch.Tensor  # FakeTensor, FunctionalTensor, other subclasses
        or torch._C._len_torch_dispatch_stack() > 0  # make_fx, FakeTensorMode, other dispatch modes
        or torch._C._is_torch_function_mode_enabled()  # TorchFunctionMode (incl. `with torch.device(..)`)
    )


def paged_mqa_logits(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    out_logits: torch.Tensor,
    context_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    max_model_len: int,
    Preshuffle: bool = False,
    KVBlockSize: int = 1,
    *,
    context_hint: int | None = None,
    clean_logits: bool = False,
    backend: str | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """FP8 paged MQA logits, written into ``out_logits`` (returned). Same contract and arguments
    as :func:`paged_mqa_logits.op.paged_mqa_logits_eager`; works under ``torch.compile(fullgraph=True)``
    and inside CUDA/HIP graph capture."""
    _op.check_options(context_hint, clean_logits, backend, config)
    if torch.compiler.is_compiling() or _must_use_op(out_logits):
        op(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle, KVBlockSize,
           context_hint=NO_HINT if context_hint is None else context_hint, clean_logits=clean_logits,
           backend=backend, config=None if config is None else json.dumps(config, sort_keys=True))
        return out_logits
    return _op.paged_mqa_logits_eager(
        q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle, KVBlockSize,
        context_hint=context_hint, clean_logits=clean_logits, backend=backend, config=config,
    )


paged_mqa_logits.__doc__ += "\n\n" + (_op.paged_mqa_logits_eager.__doc__ or "")

__all__ = ["paged_mqa_logits", "op", "SCHEMA", "EAGER_VIA_OP"]
