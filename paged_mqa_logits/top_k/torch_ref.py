"""``torch`` backend: ``torch.topk`` over order-preserving integer keys, exact, any device.

Every column of a row is read and those past the row's length are masked, so what they hold
(stale logits, NaN) cannot change the result. Keys rather than the floats themselves give the
contract's NaN rule (NaN above +inf, whatever its sign bit) and let the masked columns sort
below every visible value, ``-inf`` included; no value is read back to the host."""

from __future__ import annotations

import torch

from .validate import TopkCall

#: below every key of a float (keys are int32 values widened to int64)
_HIDDEN = -(2**40)


def order_keys(values: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as the fp32 values are, NaN (either sign) above +inf."""
    bits = values.float().contiguous().view(torch.int32)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keys = torch.where(values != values, torch.full_like(keys, 0x7FFFFFFF), keys)
    return keys.long()


def visible_lengths(lengths: torch.Tensor, next_n: int, width: int) -> torch.Tensor:
    """Visible positions per row ([rows] int64): ``L_b - next_n + j + 1`` (1-D) or ``lens[b, j]`` (2-D),
    clamped into ``[0, width]``."""
    if lengths.dim() == 2:
        n = lengths.long().reshape(-1)
    else:
        j = torch.arange(next_n, device=lengths.device)
        n = (lengths.long()[:, None] - next_n + 1 + j[None, :]).reshape(-1)
    return n.clamp(0, width)


def page_transform(positions: torch.Tensor, block_table: torch.Tensor, block_size: int, next_n: int) -> torch.Tensor:
    """``block_table[b, p // block_size] * block_size + p % block_size`` per row, ``-1`` kept."""
    seq = torch.arange(positions.shape[0], device=positions.device) // next_n
    live = positions >= 0
    p = positions.long().clamp_min(0)
    blocks = block_table.long()[seq[:, None], p // block_size]
    return torch.where(live, blocks * block_size + p % block_size, -1).to(torch.int32)


def launch(call: TopkCall, knobs: dict | None = None) -> None:
    rows, width = call.logits.shape
    k = call.k
    n = visible_lengths(call.lengths, call.next_n, width)
    columns = torch.arange(width, device=call.logits.device)
    visible = columns[None, :] < n[:, None]
    keys = torch.where(visible, order_keys(call.logits), _HIDDEN)
    take = min(k, width)
    positions = torch.full((rows, k), -1, dtype=torch.int32, device=call.logits.device)
    if take:
        chosen_keys, chosen = keys.topk(take, dim=1, sorted=True)  # sorted: the -1s come last
        positions[:, :take] = torch.where(chosen_keys > _HIDDEN, chosen.to(torch.int32), -1)
    if call.block_table is not None:
        positions = page_transform(positions, call.block_table, call.block_size, call.next_n)
    call.out.copy_(positions)


def sort_by_value(positions: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Each row of ``positions`` ordered by descending logit, equal logits by ascending position,
    ``-1`` last (a deterministic order for callers that ask for one)."""
    if logits.shape[1] == 0:  # no visible position: every entry is -1
        return positions
    live = positions >= 0
    p = positions.long().clamp_min(0)
    keys = torch.where(live, order_keys(logits.gather(1, p)), _HIDDEN)
    by_position = torch.where(live, p, torch.iinfo(torch.int64).max).argsort(dim=1, stable=True)
    keys = keys.gather(1, by_position)
    order = by_position.gather(1, keys.argsort(dim=1, descending=True, stable=True))
    return positions.gather(1, order)
