"""The top-k op on CPU: exact sets for both backends (the Triton kernel through the
interpreter), both length layouts, strides, the page-table transform, validation, the
registered op."""

from __future__ import annotations

import pytest
import torch

import paged_mqa_logits
from paged_mqa_logits import PagedMQAArgumentError, topk

from topk_cases import BACKENDS, KINDS, adversarial_rows, assert_exact, check_adversarial, lengths_for


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_adversarial_rows(backend, kind):
    check_adversarial(backend, kind, batch=3, next_n=2, width=200, k=16, device="cpu")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("next_n", [1, 3, 8])
@pytest.mark.parametrize("lens_2d", [False, True])
def test_layouts_and_next_n(backend, next_n, lens_2d):
    g = torch.Generator().manual_seed(next_n)
    batch, width, k = 2, 150, 64
    logits = torch.randn(batch * next_n, width, generator=g)
    lengths = lengths_for(batch, next_n, width, lens_2d, g)
    out = topk(logits, lengths, k, next_n=None if lens_2d else next_n, backend=backend)
    assert_exact(out, logits, lengths, next_n, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_rows_and_out(backend):
    """Row stride past the width, a column stride of 2, an out with padded rows, bf16 logits."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(4, 2 * 300, generator=g)
    logits = base[:, ::2][:, :250]
    lengths = torch.tensor([250, 7], dtype=torch.int32)
    out = torch.full((4, 40), 99, dtype=torch.int32)[:, :32]
    topk(logits, lengths, 32, next_n=2, out=out, backend=backend)
    assert_exact(out, logits, lengths, 2, 32)
    half = torch.randn(2, 100, generator=g).bfloat16()
    result = topk(half, torch.tensor([100, 60], dtype=torch.int32), 16, backend=backend)
    assert_exact(result, half, torch.tensor([100, 60], dtype=torch.int32), 1, 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_on_distinct_values(backend):
    """Distinct values leave one right answer: both backends give the same sets, the larger batch."""
    g = torch.Generator().manual_seed(9)
    batch, next_n, width, k = 16, 2, 96, 16
    logits = torch.randperm(batch * next_n * width, generator=g).float().reshape(batch * next_n, width)
    lengths = lengths_for(batch, next_n, width, False, g)
    out = topk(logits, lengths, k, next_n=next_n, backend=backend)
    ref = topk(logits, lengths, k, next_n=next_n, backend="torch")
    assert torch.equal(out.sort(dim=1).values, ref.sort(dim=1).values)


def test_torch_backend_k2048_long_rows():
    g = torch.Generator().manual_seed(2)
    batch, next_n, width, k = 2, 2, 40000, 2048
    logits = torch.randn(batch * next_n, width, generator=g)
    logits[0, :5000] = 1.0  # ties straddling the threshold
    lengths = torch.tensor([30000, 1500], dtype=torch.int32)
    out = topk(logits, lengths, k, next_n=next_n, backend="torch")
    assert_exact(out, logits, lengths, next_n, k)


@pytest.mark.parametrize("capacity", [8192, 64, 5])
def test_radix_kernel_list_and_overflow(monkeypatch, capacity):
    """The coarse threshold bin's candidates listed, (capacity 64) the fine bin's after the second
    histogram, and (capacity 5) the exact fallback over the row."""
    from paged_mqa_logits.top_k import triton_radix

    monkeypatch.setattr(triton_radix, "CAPACITY", capacity)
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 400, generator=g)
    logits[1, :300] = 2.0  # the threshold bin is one value, 300 wide
    logits[2] = torch.randint(0, 3, (400,), generator=g).float()
    lengths = torch.tensor([400, 390, 400, 200], dtype=torch.int32)
    table = torch.randperm(128, generator=g)[:100].reshape(4, 25).to(torch.int32)
    out = topk(logits, lengths, 32, backend="triton_radix")
    assert_exact(out, logits, lengths, 1, 32)
    mapped = topk(logits, lengths, 32, block_table=table, block_size=16, backend="triton_radix")
    assert_exact(mapped, logits, lengths, 1, 32, table, 16)


@pytest.mark.parametrize("capacity", [8192, 64, 5])
@pytest.mark.parametrize("split", [2, 4])
def test_radix_split_rows_match_one_program(monkeypatch, capacity, split):
    """Rows split over programs (four launches) select what one program per row selects, slot for slot."""
    from paged_mqa_logits.top_k import triton_radix
    from paged_mqa_logits.top_k.validate import check_call

    monkeypatch.setattr(triton_radix, "CAPACITY", capacity)
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(6, 300, generator=g)
    logits[0, :120] = 1.0
    lengths = torch.tensor([[300, 250], [10, 0], [299, 200]], dtype=torch.int32)
    table = torch.randperm(64, generator=g)[:60].reshape(3, 20).to(torch.int32)
    one, many = (torch.full((6, 16), 7, dtype=torch.int32) for _ in range(2))
    triton_radix.launch(check_call(logits, lengths, None, 16, one, table, 16), split=1)
    triton_radix.launch(check_call(logits, lengths, None, 16, many, table, 16), split=split)
    assert torch.equal(one, many)
    assert_exact(many, logits, lengths, 2, 16, table, 16)


def test_radix_split_choice():
    from paged_mqa_logits.top_k.triton_radix import split_for

    assert split_for(rows=4096, width=8192, sms=132) == 1  # the rows fill the GPU
    assert split_for(rows=2, width=163840, sms=132) == 16  # few long rows: the most chunks
    assert split_for(rows=16, width=32768, sms=132) == 8  # chunks of 4096 columns at least
    assert split_for(rows=16, width=8192, sms=132) == 2


@pytest.mark.parametrize("backend", ["triton", "triton_radix", "triton_sample"])
def test_interpreted_kernel_longer_rows(backend):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3000, generator=g)
    logits[1, 100:2000] = 0.5
    lengths = torch.tensor([3000, 2500], dtype=torch.int32)
    out = topk(logits, lengths, 64, backend=backend)
    assert_exact(out, logits, lengths, 1, 64)


def _sample_rows(kind: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int, list[bool]]:
    """Rows (longer than the 2048-key sample, so it is spread over them) for each path of
    ``triton_sample``: logits, 1-D lengths, k, and per row whether its list holds the top k."""
    if kind in ("list_fits", "list_searched"):  # the list holds the top k: one read, the list finished
        return torch.randn(2, 5000, generator=g), torch.tensor([5000, 3000], dtype=torch.int32), 64, [True, True]
    if kind == "sorted":  # ascending lists the top k; descending falls back: the sample holds the row's
        up = torch.arange(5000).float()  # top 128 whole, so the seed's 57-71 sampled keys are the row's too
        return torch.stack([up, -up]), torch.tensor([5000, 4000], dtype=torch.int32), 64, [True, False]
    if kind == "short_row":  # the sample is the row: the seed keeps k to 1.25 k of it
        return torch.randn(2, 2000, generator=g), torch.tensor([2000, 1000], dtype=torch.int32), 64, [True, True]
    if kind == "seed_too_low":  # ties: more keys are >= the seed than the list holds (64 entries here)
        x = torch.randn(2, 600, generator=g)
        x[0] = 0.5
        x[1, ::2] = 5.0  # a tie above every other value, half the row wide
        return x, torch.tensor([600, 599], dtype=torch.int32), 16, [False, False]
    if kind == "seed_too_high":  # the sampled pieces hold the row's largest values: fewer than k listed
        n = 4096
        x = torch.randn(1, n, generator=g)
        piece = torch.arange(2048)
        sampled = (piece // 128) * (n // 16) + piece % 128  # the kernel's sample positions for n > 2048
        x[0, sampled[:1600]] = 10.0
        return x, torch.tensor([n], dtype=torch.int32), 2048, [False]
    raise ValueError(kind)


def _list_counts(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> list[int]:
    """What ``triton_sample`` lists for each row (its seed's survivors, also past the capacity), from
    the kernel itself stopped after the compaction; 0 for rows written whole."""
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    out = torch.empty(logits.shape[0], k, dtype=torch.int32)
    _, counts = triton_sample.launch(check_call(logits, lengths, None, k, out), split=1,
                                     stop_after="compaction")
    return counts[:, 0].tolist()


@pytest.mark.parametrize("kind", ["list_fits", "list_searched", "sorted", "short_row", "seed_too_low",
                                  "seed_too_high"])
def test_sample_kernel_paths(monkeypatch, kind):
    """``triton_sample``'s paths: the list finish in registers (seeded from a spread sample or from
    the whole short row) and (list_searched: a list longer than the registers hold) where it lies,
    and both fallbacks to ``triton_radix``'s path; page table on and off."""
    from paged_mqa_logits.top_k import triton_sample

    if kind == "seed_too_low":
        monkeypatch.setattr(triton_sample, "CAPACITY", 5)  # capacity max(5, 4 k): 64 entries at k 16
    if kind == "list_searched":
        monkeypatch.setattr(triton_sample, "REGISTER_LIST", 64)
    g = torch.Generator().manual_seed(13)
    logits, lengths, k, expected = _sample_rows(kind, g)
    counts = _list_counts(logits, lengths, k)
    capacity = triton_sample.capacity_for(k, logits.shape[1])
    fits = [k <= c <= capacity for c in counts]
    assert fits == expected, (counts, capacity)
    if kind == "seed_too_high":
        assert counts[0] < k
    if kind == "seed_too_low":
        assert min(counts) > capacity
    if kind == "list_searched":
        assert min(counts) > 64
    out = topk(logits, lengths, k, backend="triton_sample")
    assert_exact(out, logits, lengths, 1, k)
    if kind != "seed_too_high":
        table = torch.randperm(1024, generator=g)[: 2 * 320].reshape(2, 320)[: logits.shape[0]].to(torch.int32)
        mapped = topk(logits, lengths, k, block_table=table, block_size=16, backend="triton_sample")
        assert_exact(mapped, logits, lengths, 1, k, table, 16)


def test_sample_split_rows(monkeypatch):
    """Rows cut into chunks (two launches): the parts gathered and finished; distinct values, so the
    sets equal one program's."""
    _check_sample_split_rows(monkeypatch, 4, 8192)


def test_sample_split_rows_overflow(monkeypatch):
    """The same with a list of 64 entries (capacity 5: max(5, 4 k)): the gathered list overflows and
    the rows fall back (the `full` tier)."""
    _check_sample_split_rows(monkeypatch, 4, 5)


def _check_sample_split_rows(monkeypatch, split, capacity):
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    monkeypatch.setattr(triton_sample, "CAPACITY", capacity)
    g = torch.Generator().manual_seed(14)
    logits = torch.randperm(6 * 2600, generator=g).float().reshape(6, 2600)
    lengths = torch.tensor([[2600, 2500], [10, 0], [2599, 900]], dtype=torch.int32)
    table = torch.randperm(1024, generator=g)[:3 * 170].reshape(3, 170).to(torch.int32)
    one, many = (torch.full((6, 16), 7, dtype=torch.int32) for _ in range(2))
    triton_sample.launch(check_call(logits, lengths, None, 16, one, table, 16), split=1)
    triton_sample.launch(check_call(logits, lengths, None, 16, many, table, 16), split=split)
    assert torch.equal(one.sort(dim=1).values, many.sort(dim=1).values)
    assert_exact(many, logits, lengths, 2, 16, table, 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_page_table_transform(backend):
    g = torch.Generator().manual_seed(4)
    batch, next_n, width, k, block = 2, 2, 128, 16, 16
    logits = torch.randn(batch * next_n, width, generator=g)
    lengths = torch.tensor([100, 9], dtype=torch.int32)
    table = torch.randperm(64, generator=g)[: batch * 8].reshape(batch, 8).to(torch.int32)
    out = topk(logits, lengths, k, next_n=next_n, block_table=table, block_size=block, backend=backend)
    assert_exact(out, logits, lengths, next_n, k, table, block)
    plain = topk(logits, lengths, k, next_n=next_n, backend=backend)
    seq = torch.arange(batch * next_n)[:, None] // next_n
    mapped = torch.where(plain >= 0, table.long()[seq, plain.long().clamp_min(0) // block] * block + plain % block, -1)
    assert torch.equal(out.sort(dim=1).values, mapped.int().sort(dim=1).values)


def test_empty_batch_and_zero_width():
    out = topk(torch.empty(0, 10), torch.empty(0, dtype=torch.int32), 8)
    assert out.shape == (0, 8)
    for backend in BACKENDS:
        out = topk(torch.empty(2, 0), torch.tensor([5, 0], dtype=torch.int32), 4, backend=backend)
        assert bool((out == -1).all())


def test_registered_op_and_compile():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 64, generator=g)
    lengths = torch.tensor([64, 30], dtype=torch.int32)
    out = torch.empty(4, 8, dtype=torch.int32)
    paged_mqa_logits.top_k.op.op(logits, lengths, 2, 8, out, None, 1, "torch")
    assert_exact(out, logits, lengths, 2, 8)

    def step(x, lens):
        return topk(x, lens, 8, next_n=2)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert_exact(compiled(logits, lengths), logits, lengths, 2, 8)


def _call(**overrides):
    args = dict(logits=torch.randn(4, 32), lengths=torch.tensor([32, 5], dtype=torch.int32), k=8, next_n=2,
                out=torch.zeros(4, 8, dtype=torch.int32))
    args.update(overrides)
    return args


@pytest.mark.parametrize("overrides, argument, fragment", [
    (dict(logits=torch.randn(4, 32).double()), "logits", "dtype float32 or bfloat16"),
    (dict(logits=torch.randn(5, 32)), "logits", "4 rows (batch 2 x next_n 2)"),
    (dict(lengths=torch.tensor([32, 5])), "lengths", "dtype int32"),
    (dict(lengths=torch.ones(2, 3, dtype=torch.int32)), "next_n", "lengths.shape[1]=3"),
    (dict(k=0), "k", "an int in 1..4096"),
    (dict(k=5000), "k", "an int in 1..4096"),
    (dict(next_n=9, logits=torch.randn(18, 32)), "next_n", "1..8"),
    (dict(out=torch.zeros(4, 8, dtype=torch.int64)), "out", "dtype int32"),
    (dict(out=torch.zeros(4, 9, dtype=torch.int32)), "out", "shape [rows=4, k=8]"),
    (dict(out=torch.zeros(8, 4, dtype=torch.int32).t()), "out", "contiguous last dimension"),
    (dict(block_size=4), "block_size", "1 without a `block_table`"),
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int32), block_size=4), "block_table", "covering every column"),
    (dict(block_table=torch.zeros(3, 8, dtype=torch.int32), block_size=4), "block_table", "2 rows"),
    (dict(backend="cuda"), "backend", "'torch', 'triton', 'triton_radix'"),
])
def test_validation_names_the_argument(overrides, argument, fragment):
    args = _call(**overrides)
    before = args["out"].clone()
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{argument}`") as error:
        topk(**args)
    assert fragment in str(error.value) and "got" in str(error.value)
    assert torch.equal(args["out"], before)  # nothing written


def test_out_aliasing_an_input_is_refused():
    storage = torch.zeros(100, dtype=torch.int32)
    lengths = storage[:2]
    lengths.fill_(16)
    with pytest.raises(PagedMQAArgumentError, match="argument `out`.*overlaps `lengths`"):
        topk(torch.randn(2, 16), lengths, 4, out=storage[:8].view(2, 4))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("split", [1, 2])
def test_sample_held_rows(kind, split):
    """Rows no longer than a compaction step (``BLOCK`` 512 here: up to 512 visible positions) are
    selected whole in registers, every adversarial kind, ragged lengths, 2-D lengths, one program a
    row and split (the finish kernel holds them; the chunks list nothing); longer rows of the same
    call take the list."""
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    g = torch.Generator().manual_seed(15)
    width, k = 700, 100
    logits = adversarial_rows(kind, 6, width, k, g)
    lengths = torch.tensor([[512, 100], [300, 700], [513, 50]], dtype=torch.int32)
    table = torch.randperm(1024, generator=g)[:3 * 50].reshape(3, 50).to(torch.int32)
    assert triton_sample.held_row_for(512, width, triton_sample.CPU_LIST_BLOCK) == 512
    out = torch.full((6, k), 7, dtype=torch.int32)
    call = check_call(logits, lengths, None, k, out, table, 16)
    triton_sample.launch(call, {"BLOCK": 512}, split=split)
    assert_exact(out, logits, lengths, 2, k, table, 16)
    _, counts = triton_sample.launch(call, {"BLOCK": 512}, split=split, stop_after="compaction")
    listed = counts.sum(dim=1).tolist()
    assert [c > 0 for c in listed] == [False, False, False, True, True, False]  # 513 and 700 are listed


@pytest.mark.parametrize("kind", KINDS)
def test_sample_bf16_rows(kind):
    """bf16 logits, searched on their keys' 16 high bits: rows held whole and listed rows exact on every
    adversarial kind, and on spread values the seed found among the shifted keys, compared against the
    fp32 values, lists about what it lists for fp32 logits (124-141 here): at least k, at most 4 k (a
    threshold left in the shifted keys' scale would keep every positive value, about 2500)."""
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    g = torch.Generator().manual_seed(16)
    width, k = 5000, 64
    logits = adversarial_rows(kind, 4, width, k, g).bfloat16()
    lengths = torch.tensor([5000, 3000, 400, 60], dtype=torch.int32)  # listed, listed, held, written whole
    out = torch.full((4, k), 7, dtype=torch.int32)
    call = check_call(logits, lengths, None, k, out)
    triton_sample.launch(call, {"BLOCK": 512}, split=1)
    assert_exact(out, logits, lengths, 1, k)
    _, counts = triton_sample.launch(call, {"BLOCK": 512}, split=1, stop_after="compaction")
    listed = counts[:, 0].tolist()
    assert listed[2:] == [0, 0]
    if kind == "random":
        assert all(k <= count <= 4 * k for count in listed[:2]), listed


@pytest.mark.parametrize("width", [1, 10, 33])
def test_sample_rows_narrower_than_a_step(width):
    """Widths below a step's columns (64 on CPU): the held row is still one whole step."""
    g = torch.Generator().manual_seed(width)
    logits = torch.randn(3, width, generator=g)
    lengths = torch.tensor([width, max(width - 1, 0), 0], dtype=torch.int32)
    k = max(1, width // 2)
    assert_exact(topk(logits, lengths, k, backend="triton_sample"), logits, lengths, 1, k)


@pytest.mark.parametrize("split", [1, 4])
def test_sample_compaction_with_and_without_prefetch(monkeypatch, split):
    """The compaction that loads a step ahead (NVIDIA, CPU) and the one that loads each step as it lists it
    (AMD: ``triton_sample.prefetch_for``) list the same entries in the same order, so their selections are
    equal slot for slot: rows of many full steps, a masked tail, chunks of
    750 columns (steps of 128), the page table."""
    from paged_mqa_logits.top_k import triton_sample
    from paged_mqa_logits.top_k.validate import check_call

    assert triton_sample.prefetch_for("sm_90") and triton_sample.prefetch_for("cpu")
    assert not triton_sample.prefetch_for("gfx942") and not triton_sample.prefetch_for("gfx950")
    g = torch.Generator().manual_seed(17)
    logits = torch.randn(3, 3001, generator=g)
    lengths = torch.tensor([3001, 2600, 1000], dtype=torch.int32)
    table = torch.randperm(1024, generator=g)[:3 * 200].reshape(3, 200).to(torch.int32)
    results = []
    for prefetch in (True, False):
        monkeypatch.setattr(triton_sample, "prefetch_for", lambda arch, prefetch=prefetch: prefetch)
        out = torch.full((3, 32), 7, dtype=torch.int32)
        call = check_call(logits, lengths, None, 32, out, table, 16)
        triton_sample.launch(call, {"BLOCK": 128}, split=split)
        assert_exact(out, logits, lengths, 1, 32, table, 16)
        parts, counts = triton_sample.launch(call, {"BLOCK": 128}, split=split, stop_after="compaction")
        results.append((out, counts, [triton_sample.listed_positions(parts[r, c, :counts[r, c]])
                                      for r in range(3) for c in range(split)]))
    (out_a, counts_a, lists_a), (out_b, counts_b, lists_b) = results
    assert torch.equal(out_a, out_b) and torch.equal(counts_a, counts_b)
    assert all(torch.equal(a, b) for a, b in zip(lists_a, lists_b))
