"""``out_logits`` must not overlap itself or any input; checked before anything is written."""

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import PagedMQAArgumentError, paged_mqa_logits
from paged_mqa_logits.reference import make_inputs


def base():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)


def expect_overlap(inp, what):
    with pytest.raises(PagedMQAArgumentError) as err:
        paged_mqa_logits(*positional(inp))
    assert "`out_logits`" in str(err.value) and what in str(err.value), str(err.value)


def test_rows_sharing_memory_are_rejected():
    inp = base()
    row = torch.zeros(56)
    expect_overlap(dict(inp, out_logits=row.expand(4, 56)), "stride(0) 0")
    flat = torch.zeros(4 * 56)
    expect_overlap(dict(inp, out_logits=flat.as_strided((4, 56), (20, 1))), "stride(0) 20")
    assert not flat.any()


@pytest.mark.parametrize("name", ["weights", "q_fp8", "kv_cache", "context_lens", "kv_indices"])
def test_out_aliasing_an_input_is_rejected(name):
    inp = base()
    rows, width = 4, 56
    buffer = torch.zeros(rows * width + 8192, dtype=torch.float32)
    source = inp[name]
    nbytes = source.untyped_storage().nbytes()
    placed_bytes = buffer.view(torch.uint8)[1024 : 1024 + nbytes]
    placed_bytes.copy_(torch.frombuffer(bytearray(source.untyped_storage()), dtype=torch.uint8))
    placed = placed_bytes.view(source.dtype).as_strided(source.shape, source.stride(), source.storage_offset())
    out = buffer[: rows * width].view(rows, width)
    before = buffer.clone()
    expect_overlap(dict(inp, out_logits=out, **{name: placed}), f"overlaps `{name}`")
    assert torch.equal(before.view(torch.int32), buffer.view(torch.int32))


def test_disjoint_slices_of_one_buffer_are_fine():
    """An engine workspace holding the logits and, elsewhere, another input is accepted,
    including an input that sits in the gap between output rows."""
    inp = base()
    rows, width = 4, 48
    buffer = torch.zeros(rows * 2 * width + 256, dtype=torch.float32)
    out = buffer[: rows * 2 * width].view(rows, 2 * width)[:, :width]  # rows with gaps of `width`
    weights = buffer[rows * 2 * width : rows * 2 * width + 128].view(4, 32)
    weights.copy_(inp["weights"])
    paged_mqa_logits(*positional(dict(inp, out_logits=out, weights=weights)))
    gap_input = buffer[width : width + 32].view(1, 32)  # in the gap after row 0
    assert gap_input.data_ptr() >= out.data_ptr() + width * 4
    one_row = make_inputs(1, 1, 32, [40], kv_block_size=16, max_model_len=48)
    gap_input.copy_(one_row["weights"])
    paged_mqa_logits(*positional(dict(one_row, out_logits=out[:1], weights=gap_input)))


def test_an_input_in_the_padding_between_outs_rows_is_fine():
    """Weights stored in the columns past max_model_len of out's rows share no byte with what is
    written: accepted, and the logits are right; one column further they would, and are refused."""
    inp = base()
    rows, width, heads = 4, 48, 32
    buffer = torch.full((rows, width + heads), float("nan"))
    out = buffer[:, :width]
    buffer[:, width:] = inp["weights"]
    paged_mqa_logits(*positional(dict(inp, out_logits=out, weights=buffer[:, width:])))
    inp["out_logits"].fill_(float("nan"))
    paged_mqa_logits(*positional(inp))
    assert torch.equal(out.nan_to_num(), inp["out_logits"][:rows, :width].nan_to_num())
    assert torch.equal(buffer[:, width:], inp["weights"])
    shifted = torch.zeros((rows, width + heads))
    shifted[:, width - 1: width - 1 + heads] = inp["weights"]
    expect_overlap(dict(inp, out_logits=shifted[:, :width], weights=shifted[:, width - 1: width - 1 + heads]),
                   "overlaps `weights`")
