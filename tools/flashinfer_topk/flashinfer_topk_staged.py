"""FlashInfer's ragged top-k as ``build.py`` built it (``flashinfer_topk_staged_cuda.so`` beside
this file, where ``build.py`` copies it), called through ctypes on torch's current stream:

    top_k_ragged_transform(logits, lengths, out, k)

fp32 ``logits [rows, width]`` (rows contiguous: FlashInfer's ragged transform takes no row
stride), int32 ``lengths [rows]`` (row r sees positions < lengths[r]), int32 ``out [rows, k]``
(contiguous) receives each row's top-k positions, unordered, ``-1`` past a row shorter than k.
FlashInfer's row-state buffer (1 MiB, zeroed once, as its own wrapper allocates it) and the zero
offsets are allocated once per device, at the first call outside a CUDA graph capture."""

from __future__ import annotations

import ctypes
import math
import os

import torch

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flashinfer_topk_staged_cuda.so")
ROW_STATES_BYTES = 1 << 20

if not os.path.isfile(LIBRARY):
    raise ImportError(f"{LIBRARY} is not built: run build.py in the staged folder")
_lib = ctypes.CDLL(LIBRARY)
_lib.fi_topk_ragged_transform_f32.restype = ctypes.c_int
_lib.fi_topk_ragged_transform_f32.argtypes = [
    ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
    ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_lib.fi_topk_error_string.restype = ctypes.c_char_p
_lib.fi_topk_error_string.argtypes = [ctypes.c_int]
_lib.fi_topk_row_state_bytes.restype = ctypes.c_int64

_row_states: dict[int, torch.Tensor] = {}
_offsets: dict[int, torch.Tensor] = {}


def _expect(ok: bool, name: str, expected: str, got) -> None:
    if not ok:
        raise ValueError(f"top_k_ragged_transform: {name}: expected {expected}, got {got}")


def check(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int) -> None:
    """The arguments' dtypes, shapes, layout and device, each refusal naming the argument."""
    _expect(logits.dtype == torch.float32 and logits.dim() == 2, "logits", "fp32 [rows, width]",
            f"{logits.dtype} {list(logits.shape)}")
    _expect(logits.stride(1) == 1 and logits.stride(0) == logits.shape[1], "logits",
            f"contiguous rows (strides ({logits.shape[1]}, 1))", tuple(logits.stride()))
    rows, width = logits.shape
    # FlashInfer loads gcd(width, 4) floats at a time from each row's start
    align = 4 * math.gcd(width, 4)
    _expect(logits.data_ptr() % align == 0, "logits", f"a start aligned to {align} bytes",
            f"an address {logits.data_ptr() % align} bytes past")
    _expect(isinstance(k, int) and k >= 1, "k", "a positive int", k)
    _expect(lengths.dtype == torch.int32 and tuple(lengths.shape) == (rows,) and lengths.is_contiguous(), "lengths",
            f"contiguous int32 [{rows}]", f"{lengths.dtype} {list(lengths.shape)} strides {lengths.stride()}")
    _expect(out.dtype == torch.int32 and tuple(out.shape) == (rows, k) and out.is_contiguous(),
            "out", f"contiguous int32 [{rows}, {k}]", f"{out.dtype} {list(out.shape)} strides {out.stride()}")
    _expect(logits.is_cuda, "logits", "a CUDA tensor", logits.device)
    for name, t in (("lengths", lengths), ("out", out)):
        _expect(t.device == logits.device, name, f"a tensor on {logits.device}", t.device)


def _buffers(device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The device's row states and zero offsets (grown, never shrunk, to ``rows``)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _row_states:
        # one RadixRowState a CTA group, at most a group an SM
        need = torch.cuda.get_device_properties(index).multi_processor_count * _lib.fi_topk_row_state_bytes()
        _row_states[index] = torch.zeros(max(ROW_STATES_BYTES, need), dtype=torch.uint8, device=device)
    if index not in _offsets or _offsets[index].numel() < rows:
        _offsets[index] = torch.zeros(rows, dtype=torch.int32, device=device)
    return _row_states[index], _offsets[index]


def top_k_ragged_transform(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int) -> torch.Tensor:
    check(logits, lengths, out, k)
    rows, width = logits.shape
    states, offsets = _buffers(logits.device, rows)
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    code = _lib.fi_topk_ragged_transform_f32(
        logits.data_ptr(), rows, width, logits.stride(0), lengths.data_ptr(), offsets.data_ptr(), out.data_ptr(), k,
        states.data_ptr(), states.device.index, stream)
    if code != 0:
        raise RuntimeError(f"FlashInfer TopKRaggedTransformDispatch failed: "
                           f"{_lib.fi_topk_error_string(code).decode(errors='replace')}")
    return out
