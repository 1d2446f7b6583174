"""Rows and checks the top-k tests share (CPU and GPU): the exact-set check against torch.topk
over each row's visible prefix, and row builders for the adversarial cases."""

from __future__ import annotations

import torch


def visible(lengths: torch.Tensor, next_n: int, width: int) -> list[int]:
    """Visible positions per row, by the contract's two layouts (computed on the host)."""
    lens = lengths.cpu().tolist()
    if lengths.dim() == 2:
        n = [v for row in lens for v in row]
    else:
        n = [length - next_n + 1 + j for length in lens for j in range(next_n)]
    return [min(max(v, 0), width) for v in n]


def assert_exact(out: torch.Tensor, logits: torch.Tensor, lengths: torch.Tensor, next_n: int, k: int,
                 block_table: torch.Tensor | None = None, block_size: int = 1) -> None:
    """Every row: ``min(k, n)`` distinct visible positions whose values are torch.topk's values
    (as a multiset), then ``-1``; with a block table, the transform of such positions."""
    out, logits = out.cpu(), logits.float().cpu()
    table = block_table.cpu() if block_table is not None else None
    for r, n in enumerate(visible(lengths, next_n, logits.shape[1])):
        take = min(k, n)
        row = out[r]
        assert bool((row[take:] == -1).all()), f"row {r}: expected -1 after {take} positions, got {row.tolist()}"
        chosen = row[:take].long()
        if table is not None:  # invert the transform: blocks are distinct per sequence in the tests
            b = r // next_n
            slots = table[b].long()
            column = (slots[None, :] == (chosen // block_size)[:, None]).float().argmax(dim=1)
            chosen = column * block_size + chosen % block_size
        assert len(set(chosen.tolist())) == take, f"row {r}: positions not distinct: {chosen.tolist()}"
        assert bool(((chosen >= 0) & (chosen < n)).all()), f"row {r}: a position past {n}: {chosen.tolist()}"
        expected = torch.topk(logits[r, :n], take).values if take else logits[r, :0]
        got = logits[r, chosen]
        torch.testing.assert_close(got.sort().values, expected.sort().values, rtol=0, atol=0, equal_nan=True,
                                   msg=f"row {r}: not the top {take}")


def adversarial_rows(kind: str, rows: int, width: int, k: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, width, generator=generator)
    if kind == "random":
        return x
    if kind == "constant":
        return torch.full((rows, width), 0.25)
    if kind == "ties_at_threshold":  # few values, so many equal the k-th largest
        return torch.randint(0, 4, (rows, width), generator=generator).float()
    if kind == "neg_inf":
        x[:, ::3] = float("-inf")
        x[0, :] = float("-inf")
        return x
    if kind == "one_huge":
        x[:, width // 2] = 3.0e38
        return x
    if kind == "signed_zeros":
        return torch.where(torch.rand(rows, width, generator=generator) < 0.5, -0.0, 0.0)
    if kind == "nan":
        x[:, 1::7] = float("nan")
        return x
    raise ValueError(kind)


#: every backend of the op
BACKENDS = ("torch", "triton", "triton_radix", "triton_sample")


def check_adversarial(backend: str, kind: str, batch: int, next_n: int, width: int, k: int, device: str) -> None:
    """One ``kind`` of rows (seeded), ragged 1-D lengths, the op on ``device``, the exact-set check."""
    from paged_mqa_logits import topk

    g = torch.Generator().manual_seed(1)
    logits = adversarial_rows(kind, batch * next_n, width, k, g)
    lengths = lengths_for(batch, next_n, width, False, g)
    out = topk(logits.to(device), lengths.to(device), k, next_n=next_n, backend=backend)
    assert out.dtype == torch.int32 and out.shape == (batch * next_n, k)
    assert_exact(out, logits, lengths, next_n, k)


KINDS = ("random", "constant", "ties_at_threshold", "neg_inf", "one_huge", "signed_zeros", "nan")


def lengths_for(batch: int, next_n: int, width: int, lens_2d: bool, generator: torch.Generator) -> torch.Tensor:
    """Ragged lengths, zero-length and full-width rows included."""
    seq = torch.randint(0, width + 1, (batch,), generator=generator, dtype=torch.int32)
    seq[0] = 0
    if batch > 1:
        seq[1] = width
    if not lens_2d:
        return seq
    j = torch.arange(next_n, dtype=torch.int32)
    return (seq[:, None] - next_n + 1 + j[None, :]).clamp_min(0).to(torch.int32)
