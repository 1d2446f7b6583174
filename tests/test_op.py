"""The public op on CPU against the reference, and the output contract."""

import pytest
import torch

from op_cases import build, positional, random_case, reference_for, run_and_check
from paged_mqa_logits import paged_mqa_logits
from paged_mqa_logits.reference import make_inputs


@pytest.mark.parametrize("seed", range(24))
def test_random_matrix_torch_backend(seed):
    check = run_and_check(paged_mqa_logits, build(random_case(seed)), backend="torch")
    assert check.ok, check.describe()


@pytest.mark.parametrize("seed", range(6))
def test_random_matrix_dispatch(seed):
    check = run_and_check(paged_mqa_logits, build(random_case(100 + seed)))
    assert check.ok, check.describe()


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_both_fp8_flavours_on_cpu(fp8):
    inp = build(random_case(7), fp8_dtype=fp8)
    check = run_and_check(paged_mqa_logits, inp)
    assert check.ok, check.describe()


def test_sentinel_contract_exact():
    """Valid positions are written, every other element keeps its exact bits."""
    inp = make_inputs(2, 2, 32, [10, 3], kv_block_size=16, max_model_len=20, out_row_pad=2)
    out = inp["out_logits"]
    pattern = torch.arange(out.numel(), dtype=torch.int32).reshape(out.shape) | 0x7F800001  # distinct NaN payloads
    out.view(torch.int32).copy_(pattern)
    paged_mqa_logits(*positional(inp))
    ref = reference_for(inp)
    valid = torch.isfinite(ref)
    bits = out.view(torch.int32)
    assert not torch.isnan(out[:4, :20][valid]).any()
    assert torch.equal(bits[:4, :20][~valid], pattern[:4, :20][~valid])
    assert torch.equal(bits[:, 20:], pattern[:, 20:])  # columns >= max_model_len
    assert torch.equal(bits[4:], pattern[4:])  # rows beyond B*next_n
    # row (b=1, j=0) sees p <= 3 - 2 + 0 -> 2 positions
    assert valid[2].sum() == 2 and valid[3].sum() == 3


def test_1d_and_equivalent_2d_are_bit_identical():
    lens = [77, 5, 130]
    a = make_inputs(3, 4, 64, lens, kv_block_size=32, lens_2d=False, seed=11)
    b = make_inputs(3, 4, 64, lens, kv_block_size=32, lens_2d=True, seed=11)
    assert a["context_lens"].dim() == 1 and b["context_lens"].dim() == 2
    paged_mqa_logits(*positional(a))
    paged_mqa_logits(*positional(b))
    assert torch.equal(a["out_logits"].view(torch.int32), b["out_logits"].view(torch.int32))


def test_ragged_2d_uses_each_rows_own_length():
    """A non-standard 2-D table (rows not consecutive) and one whose max is not the last
    column: every row uses its own length, the work is sized by the row maximum."""
    inp = make_inputs(2, 3, 32, [40, 40], kv_block_size=16, lens_2d=True, max_model_len=40)
    inp["context_lens"].copy_(torch.tensor([[40, 7, 20], [0, 33, 2]], dtype=torch.int32))
    check = run_and_check(paged_mqa_logits, inp)
    assert check.ok, check.describe()
    ref = reference_for(inp)
    assert torch.isfinite(ref).sum(1).tolist() == [40, 7, 20, 0, 33, 2]


def test_clean_logits_sets_tail_to_minus_inf_only():
    inp = make_inputs(2, 2, 32, [10, 30], kv_block_size=16, max_model_len=24)
    out = inp["out_logits"]
    paged_mqa_logits(*positional(inp), clean_logits=True)
    ref = reference_for(inp)
    valid = torch.isfinite(ref)
    assert torch.isneginf(out[:4, :24][~valid]).all()
    assert torch.isnan(out[:, 24:]).all()  # beyond max_model_len: untouched


def test_max_model_len_shorter_than_context_never_written_beyond():
    inp = make_inputs(1, 2, 32, [100], kv_block_size=32, max_model_len=50)
    check = run_and_check(paged_mqa_logits, inp)
    assert check.ok
    assert torch.isnan(inp["out_logits"][:, 50:]).all()


def test_zero_max_model_len_and_zero_contexts_write_nothing():
    inp = make_inputs(2, 1, 16, [0, 0], kv_block_size=16, max_model_len=0)
    before = inp["out_logits"].clone()
    paged_mqa_logits(*positional(inp))
    assert torch.equal(before.view(torch.int32), inp["out_logits"].view(torch.int32))


def test_returns_out_logits():
    inp = make_inputs(1, 1, 16, [5], kv_block_size=16)
    assert paged_mqa_logits(*positional(inp)) is inp["out_logits"]


def test_forced_backend_that_cannot_serve_raises():
    from paged_mqa_logits.validate import PagedMQAArgumentError

    inp = make_inputs(1, 1, 16, [5], kv_block_size=16)
    with pytest.raises(PagedMQAArgumentError, match="backend"):
        paged_mqa_logits(*positional(inp), backend="gluon")
    with pytest.raises(PagedMQAArgumentError, match="config"):
        paged_mqa_logits(*positional(inp), config={"ChunkK": 64})


@pytest.mark.parametrize("backend", [None, "torch"])
def test_the_logits_do_not_depend_on_the_outputs_width(backend):
    """The same inputs with a compact output and with a very wide one (and a block table to
    match, as AITER's regression test passes them) give bit-identical logits: the CPU path's
    chunks do not follow max_model_len."""
    lens = [39999, 30001, 1000, 39000, 20000, 12345, 333, 38000]
    inp = make_inputs(8, 1, 64, lens, kv_block_size=1, max_model_len=39999, lens_2d=False)
    wide_width = 1 << 17
    wide_table = torch.zeros((8, wide_width), dtype=torch.int32)
    wide_table[:, : inp["kv_indices"].shape[1]] = inp["kv_indices"]
    outs = []
    for width, table in ((39999, inp["kv_indices"]), (wide_width, wide_table)):
        out = torch.full((8, width), float("-inf"))
        paged_mqa_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], out, inp["context_lens"], table, width,
                         False, 1, backend=backend)
        outs.append(out)
    assert torch.equal(outs[0], outs[1][:, :39999])
    assert torch.isinf(outs[1][:, 39999:]).all()


# ----------------------------------------------------------------------------- who writes the tails
class TailsBackend:
    """The torch backend's logits; with ``fused=1`` its "kernel" writes ``clean_logits``' tails
    itself, as a marker (-123) the op's tail kernel (``-inf``) cannot be mistaken for."""

    name = "tails"
    knobs = ("fused",)
    MARK = -123.0

    def unsupported(self, problem):
        return None

    def candidates(self, problem):
        return [{"fused": 1}]

    def default_config(self, problem):
        return {"fused": 1}

    def check_config(self, config, problem=None):
        return None if set(config) <= {"fused"} else f"unknown knobs {sorted(config)}"

    def writes_tails(self, problem, config):
        return bool(config.get("fused"))

    def launch(self, args, config):
        from paged_mqa_logits import backends
        from paged_mqa_logits.problem import row_lengths

        backends.get("torch").launch(args, config)
        if args.clean_logits and config.get("fused"):
            ends = row_lengths(args.context_lens, args.problem.shape_key.next_n).reshape(-1)
            cols = torch.arange(args.max_model_len)
            target = args.out[:args.problem.rows, :args.max_model_len]
            target.masked_fill_(cols[None, :] >= ends.clamp_max(args.visible_width)[:, None], self.MARK)


@pytest.fixture
def tails(monkeypatch):
    from paged_mqa_logits import backends, dispatch, reload_tuned_table
    from paged_mqa_logits.backends import registry

    backends.register("tails", TailsBackend())
    monkeypatch.setattr(dispatch.DEFAULT, "fallback_chain", lambda arch: ("tails", "torch"))
    reload_tuned_table()
    yield
    registry._REGISTRY.pop("tails", None)
    registry._LOADED.pop("tails", None)
    reload_tuned_table()


def _tail_values(clean: bool, **options) -> set[float]:
    inp = make_inputs(2, 2, 32, [10, 30], kv_block_size=16, max_model_len=24)
    paged_mqa_logits(*positional(inp), clean_logits=clean, **options)
    invisible = ~torch.isfinite(reference_for(inp))
    return set(inp["out_logits"][:4, :24][invisible].tolist())


def test_the_chosen_kernel_or_the_tail_kernel_writes_the_tails_never_both(tails):
    """The op asks the chosen backend whether its kernel writes the tails before it launches:
    if it does, no tail kernel runs (its ``-inf`` would overwrite the marker); if not, the tail
    kernel does; without ``clean_logits`` neither does."""
    mark = TailsBackend.MARK
    assert _tail_values(True, backend="tails", config={"fused": 1}) == {mark}
    assert _tail_values(True, backend="tails", config={"fused": 0}) == {float("-inf")}
    assert _tail_values(True) == {mark}  # dispatched: the chain's first link, its default config
    assert all(v != mark and v != float("-inf") for v in _tail_values(False))  # NaN: untouched


def test_clean_logits_is_decided_when_the_call_is_validated():
    from paged_mqa_logits import PagedMQAArgumentError
    from paged_mqa_logits.op import build_launch_args

    inp = make_inputs(1, 1, 32, [10], kv_block_size=16, max_model_len=24)
    assert build_launch_args(*positional(inp), clean_logits=True).clean_logits is True
    assert build_launch_args(*positional(inp)).clean_logits is False
    with pytest.raises(PagedMQAArgumentError, match="clean_logits.*a bool.*1"):
        build_launch_args(*positional(inp), clean_logits=1)
