"""The host side of the sm_90 ``wgmma`` variant (backends/gluon/wgmma.py), without a
GPU: support, candidates and their resource fit, the split rule, and the launch path, whose
kernel arguments Triton's own binder specialises on meta tensors (``record_launches``).
The kernels themselves are cross-compiled in test_compile_wgmma.py."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.experimental.gluon")

import torch  # noqa: E402

from paged_mqa_logits.aot.launches import record_launches  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma as wg  # noqa: E402
from paged_mqa_logits.problem import LaunchArgs, Problem  # noqa: E402
from paged_mqa_logits.triton_internals.compiler import GPUTarget  # noqa: E402

WG = wg.VARIANT
ARCH = "sm_90"


def problem(heads=64, next_n=1, kv_block_size=64, preshuffle=False, lens_2d=True, batch=32, context=8192,
            **overrides) -> Problem:
    fields = dict(arch=ARCH, cu_num=132, batch=batch, next_n=next_n, heads=heads, head_dim=128,
                  kv_block_size=kv_block_size, preshuffle=preshuffle, context=context, lens_2d=lens_2d, fp8="fn",
                  max_model_len=context)
    fields.update(overrides)
    return Problem.from_record(fields)


def meta_launch_args(p: Problem, block_pad: int = 0, num_blocks: int = 50, cache_offset: int = 0) -> LaunchArgs:
    """A call of ``p`` on meta tensors: q a strided view (rows 16-byte aligned), the cache blocks
    padded by ``block_pad`` bytes and the cache starting ``cache_offset`` bytes into its storage."""
    key = p.shape_key
    block_bytes = key.kv_block_size * 132 + block_pad
    kv = torch.empty(num_blocks * block_bytes + cache_offset, dtype=torch.uint8, device="meta").as_strided(
        (num_blocks, key.kv_block_size, 1, 132), (block_bytes, 132, 132, 1), cache_offset)
    q = torch.empty(key.batch, key.next_n, key.heads + 16, 128, dtype=torch.float8_e4m3fn,
                    device="meta")[:, :, 8:key.heads + 8]
    lens = torch.empty((key.batch, key.next_n) if p.lens_2d else (key.batch,), dtype=torch.int32, device="meta")
    width = -(-p.max_model_len // 16) * 16
    return LaunchArgs(q=q, kv_cache=kv, weights=torch.empty(key.batch * key.next_n, key.heads, device="meta"),
                      out=torch.empty(key.batch * key.next_n, width, device="meta"), context_lens=lens,
                      block_table=torch.empty(key.batch, -(-p.max_model_len // key.kv_block_size), dtype=torch.int32,
                                              device="meta"),
                      max_model_len=p.max_model_len, problem=p)


def recorded_launches(variant, args: LaunchArgs, config: dict) -> list[dict]:
    """The launches ``variant.launch(args, config)`` makes, each as ``{argument: constexpr value}``
    plus ``"signature"``: specialised by Triton's binder for sm_90, nothing compiled."""
    sink = []
    with record_launches(GPUTarget("cuda", 90, 32), sink):
        variant.launch(args, config)
    out = []
    for launch in sink:
        names = launch.kernel.arg_names
        consts = {names[k[0]] if isinstance(k, tuple) else k: v for k, v in launch.constexprs.items()}
        out.append(dict(consts, signature=launch.signature))
    return out


class KnobCounter:
    """Counts the calls of ``cls.knobs`` (patched through ``monkeypatch``, so undone after the test)."""

    def __init__(self, monkeypatch, cls):
        self.calls = 0
        resolve = cls.knobs

        def counted(variant, problem, config):
            self.calls += 1
            return resolve(variant, problem, config)

        monkeypatch.setattr(cls, "knobs", counted)


# ----------------------------------------------------------------------------- support and candidates
def test_unsupported_says_why():
    assert WG.unsupported(problem()) is None
    assert WG.unsupported(problem(next_n=8, kv_block_size=1)) is None
    assert "gfx950" in WG.unsupported(problem(arch="gfx950"))
    assert "e4m3fnuz" in WG.unsupported(problem(fp8="fnuz"))
    assert "power of two" in WG.unsupported(problem(heads=48))
    assert "head_dim" in WG.unsupported(problem(head_dim=64))


@pytest.mark.parametrize("heads", (16, 32, 64, 128))
@pytest.mark.parametrize("next_n", range(1, 9))
def test_candidates_and_default_fit(heads, next_n):
    p = problem(heads, next_n)
    if heads == 128 and next_n >= 3:  # beyond the contract (H 32/64): two rows of 128 heads max
        assert "no tile configuration fits" in WG.unsupported(p)
        return
    assert WG.unsupported(p) is None
    default = WG.default_config(p)
    cands = WG.candidates(p)
    assert cands
    for cfg in cands + [default]:
        assert cfg["variant"] == WG.name
        assert set(cfg) == {"variant", *WG.knob_space}
        assert wg.fits(p, cfg["ChunkK"], cfg["RowsPerMMA"], cfg["num_stages"])
        assert WG.num_splits(p, cfg) >= 1
    assert len({tuple(sorted(c.items())) for c in cands}) == len(cands)


def test_split_rule_one_wave_equal_shares():
    # batch 1: one tile per program; batch 8 x 128 tiles with 264 slots: 32 programs of 4 tiles
    assert wg.derive_splits(132, 1, 8192, 64, 2) == 128
    assert wg.derive_splits(132, 8, 8192, 64, 2) == 32
    for batch in (1, 3, 8, 32, 64, 128, 256, 1024):
        for context in (100, 8192, 32768):
            for ctas in (1, 2, 3):
                splits = wg.derive_splits(132, batch, context, 64, ctas)
                tiles = -(-context // 64)
                assert 1 <= splits <= tiles
                assert batch * splits <= max(132 * ctas, batch)  # never more than one wave (unless batch is)
                per = -(-tiles // splits)
                assert -(-tiles // per) == splits  # no split count with the same tiles per program is smaller


# ----------------------------------------------------------------------------- launch
def test_launch_builds_the_kernels_arguments_on_meta_tensors():
    """The launch path on CPU: Triton's own binder specialises the kernel on meta copies of
    real-looking arguments (strided q, padded cache blocks, 1-D and 2-D lengths)."""
    for lens_2d, pad in ((True, 0), (False, 4)):
        p = problem(64, 2, lens_2d=lens_2d, batch=3, context=1000)
        (consts,) = recorded_launches(WG, meta_launch_args(p, block_pad=pad), WG.default_config(p))
        assert consts["KV_ALIGN"] == (16 if pad == 0 else 4) and consts["Q_ASYNC"] is True
        assert consts["LENS_2D"] is lens_2d and consts["NEXT_N"] == 2 and consts["HEADS"] == 64


def test_alignment_of_the_cache_and_q():
    assert wg.alignment_of(256, (4096, 2048, 128), 512, 64 * 144) == {"KV_ALIGN": 16, "Q_ASYNC": True}
    assert wg.alignment_of(256, (4096, 2048, 128), 516, 64 * 144) == {"KV_ALIGN": 4, "Q_ASYNC": True}
    assert wg.alignment_of(256, (4096, 2048, 128), 512, 64 * 132 + 4) == {"KV_ALIGN": 4, "Q_ASYNC": True}
    assert wg.alignment_of(264, (4096, 2048, 128), 512, 64 * 144)["Q_ASYNC"] is False
    assert wg.alignment_of(256, (4104, 2048, 128), 512, 64 * 144)["Q_ASYNC"] is False
    assert {wg.alignment_of(0, (16,), a, 16)["KV_ALIGN"] for a in (0, 4, 8)} == set(wg.KV_ALIGNS)


def test_a_repeated_launch_resolves_no_knobs(monkeypatch):
    """The cached launch plan holds everything the config decides: a second launch of the same
    problem and config resolves no knob, and still takes each call's alignment from its tensors."""
    p = problem(64, 2, batch=3, context=1000)
    config = WG.default_config(p)
    counter = KnobCounter(monkeypatch, wg.WgmmaVariant)
    WG.clear_plans()
    (first,) = recorded_launches(WG, meta_launch_args(p), config)
    assert counter.calls > 0  # the plan was computed
    planned = counter.calls
    (again,) = recorded_launches(WG, meta_launch_args(p), config)
    (offset,) = recorded_launches(WG, meta_launch_args(p, cache_offset=4), config)
    assert counter.calls == planned
    assert first == again and first["KV_ALIGN"] == 16 and offset["KV_ALIGN"] == 4
    WG.clear_plans()


@pytest.mark.parametrize("heads,next_n,rows,chunk,admitted", [
    (64, 2, 2, 64, True), (64, 2, 2, 128, True), (64, 4, 4, 64, True), (64, 4, 2, 64, True), (32, 8, 8, 64, True),
    (64, 1, 1, 128, True),
    (64, 4, 4, 128, False),  # a 256-column group of a 128-token tile: 256 accumulators
    (64, 8, 4, 64, False),  # two 256-column groups in flight: 256 accumulators
    (32, 8, 2, 64, False),  # four row groups: ptxas spills more than two
])
def test_tensor_head_sum_admission(heads, next_n, rows, chunk, admitted):
    """``HeadSum=tensor``: every row group's accumulator in flight at once within the budget, at most
    two groups; the kernel gets ``HEAD_SUM``; a table row may name it only where it fits."""
    p = problem(heads=heads, next_n=next_n)
    config = {"ChunkK": chunk, "RowsPerMMA": rows, "num_stages": 4 if chunk == 64 else 3, "HeadSum": "tensor"}
    assert WG.admits(p, config) is admitted
    assert WG.constexprs(p, config)["HEAD_SUM"] == 1
    assert WG.constexprs(p, dict(config, HeadSum="fp32"))["HEAD_SUM"] == 0
    tensor = [c for c in WG.candidates(p) if c["HeadSum"] == "tensor"]
    assert all(WG.admits(p, c) for c in tensor)
    assert bool(tensor) is any(wg.tensor_fits(p, c, r, s) for c in (64, 128) for r in wg.rows_options(p)
                               for s in wg.stages_for(c))


def test_tensor_head_sum_errors_name_the_knob():
    """Unequal row groups (next_n 3 at RowsPerMMA 2: 2 + 1) and an unknown value are rejected with
    the knob, the expected and the actual value."""
    p = problem(heads=64, next_n=3)
    error = WG.check_config({"ChunkK": 64, "RowsPerMMA": 2, "num_stages": 4, "HeadSum": "tensor"}, p)
    assert error is not None and "HeadSum" in error and "multiple of RowsPerMMA" in error
    error = WG.check_config({"ChunkK": 64, "RowsPerMMA": 1, "num_stages": 4, "HeadSum": "bf16"}, problem())
    assert error is not None and "HeadSum" in error and "bf16" in error
    assert WG.default_config(problem(heads=64, next_n=4))["HeadSum"] == "fp32"  # tensor only from a table row
