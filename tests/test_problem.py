"""The key types (ShapeKey, Target, Problem), the row rule and the fp8 / 32-bit-offset helpers."""

import dataclasses

import pytest
import torch

from op_cases import positional
from paged_mqa_logits.bench import Shape
from paged_mqa_logits.problem import (SHAPE_KEY_COLUMNS, TARGET_ONLY_FIELDS, Problem, ShapeKey, Target, fp8_dtype,
                                      fp8_flavour, kv_fits_32bit, row_lengths)
from paged_mqa_logits.reference import make_inputs
from paged_mqa_logits.table import KEY_COLUMNS, Row
from paged_mqa_logits.validate import build_launch_args
from tuner.keys import TuneKey

KEY = ShapeKey(heads=64, head_dim=128, kv_block_size=64, preshuffle=True, batch=8, next_n=2)


# ----------------------------------------------------------------------------- ShapeKey
def test_shape_key_is_a_frozen_hashable_value():
    same = ShapeKey(heads=64, head_dim=128, kv_block_size=64, preshuffle=True, batch=8, next_n=2)
    assert KEY == same and hash(KEY) == hash(same) and len({KEY, same}) == 1
    assert KEY != dataclasses.replace(KEY, batch=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        KEY.batch = 1
    with pytest.raises(TypeError):  # keyword-only: the types composed from it order fields differently
        ShapeKey(64, 128, 64, True, 8, 2)


def test_shape_key_columns_are_the_tables_key_columns():
    assert SHAPE_KEY_COLUMNS == ("heads", "head_dim", "kv_block_size", "preshuffle", "batch", "next_n", "kv_format",
                                 "logits_dtype")
    assert KEY_COLUMNS == ("arch", "cu_num") + SHAPE_KEY_COLUMNS + ("context",)
    assert KEY.values() == (64, 128, 64, True, 8, 2, "fp8", "fp32")
    assert KEY.cells() == {"heads": 64, "head_dim": 128, "kv_block_size": 64, "preshuffle": 1, "batch": 8, "next_n": 2,
                           "kv_format": "fp8", "logits_dtype": "fp32"}


def test_shape_key_family_leaves_out_only_the_batch():
    other_batch = dataclasses.replace(KEY, batch=1)
    assert KEY.family == other_batch.family == (64, 128, 64, True, 2, "fp8", "fp32")
    for change in (dict(next_n=1), dict(kv_format="fp4"), dict(logits_dtype="bf16")):
        assert dataclasses.replace(KEY, **change).family != KEY.family


def test_shape_key_parse_reads_back_its_cells():
    assert ShapeKey.parse({c: str(v) for c, v in KEY.cells().items()}) == KEY
    assert ShapeKey.parse({**{c: str(v) for c, v in KEY.cells().items()}, "preshuffle": " True "}) == KEY
    extra = {"arch": "gfx950", "context": "any", **{c: str(v) for c, v in KEY.cells().items()}}
    assert ShapeKey.parse(extra) == KEY  # other columns are not its business


@pytest.mark.parametrize("column,text,message", [
    ("batch", "sixty", "column batch must be an integer, got 'sixty'"),
    ("heads", "0", "column heads must be >= 1, got 0"),
    ("next_n", "", "column next_n must be an integer, got ''"),
    ("next_n", None, "column next_n must be an integer, got ''"),
    ("preshuffle", "2", "column preshuffle must be 0 or 1, got '2'"),
])
def test_shape_key_parse_names_the_bad_column(column, text, message):
    cells = {c: str(v) for c, v in KEY.cells().items()}
    if text is None:
        del cells[column]
    else:
        cells[column] = text
    with pytest.raises(ValueError, match=f"^{message}$"):
        ShapeKey.parse(cells)


def test_shape_key_describe():
    assert KEY.describe() == "H=64 D=128 kv_block_size=64 preshuffle=1 batch=8 next_n=2"


def test_composed_keys_hold_the_shape_key_and_no_copy_of_its_fields():
    row = Row("gfx950", 256, KEY, 8192, "gluon", (), 1.0, "p", "f:2")
    tune_key = TuneKey(KEY, (8192, 32768))
    shape = Shape(KEY, 8192)
    problem = Problem.of(KEY, Target("gfx950", 256, "cuda"), max_model_len=8192)
    for composed in (row, tune_key, shape, problem):
        assert composed.shape_key is KEY
        # one home per field: a reader goes through the key, nothing mirrors it
        assert not any(hasattr(composed, c) for c in SHAPE_KEY_COLUMNS), type(composed).__name__
    assert row.key == ("gfx950", 256, KEY, 8192) and row.family == ("gfx950",) + KEY.family
    assert tune_key.family == KEY.family and tune_key.shape(8192, "wide") == Shape(KEY, 8192, ragged="wide")
    assert Shape.of(64, 2, 8, 8192, kv_block_size=64, preshuffle=True) == shape


# ----------------------------------------------------------------------------- Target and Problem
def test_present_and_described_targets():
    assert Target.present("gfx950", 256) == Target("gfx950", 256, "cuda", hypothetical=False)
    assert Target.present("cpu", 0) == Target("cpu", 0, "cpu", hypothetical=False)
    assert Target.described("gfx950", 256) == Target("gfx950", 256, "cuda", hypothetical=True)
    assert Target.described("cpu", 0) == Target("cpu", 0, "cpu", hypothetical=True)


def test_problem_of_a_key_and_a_target_round_trips():
    target = Target("gfx942", 304, "cuda")
    problem = Problem.of(KEY, target, context=4096, max_model_len=8192)
    assert problem.shape_key == KEY and (problem.arch, problem.cu_num) == ("gfx942", 304)
    assert problem.fp8 == "fnuz"  # the arch's native flavour unless given
    assert Problem.of(KEY, target, max_model_len=8192, fp8="fn").fp8 == "fn"
    assert (problem.context, problem.lens_2d, problem.max_model_len) == (4096, True, 8192)
    assert (problem.kv_block_stride, problem.kv_base_aligned, problem.kv_32bit) == (0, True, True)
    assert problem.rows == 16


def test_a_problem_holds_the_chip_not_the_rest_of_the_target():
    """Backends judge the problem, so the same call made on GPU tensors, on CPU tensors or only
    described is one problem; the device type and ``hypothetical`` stay with the target (the
    dispatch cache keys on both, tests/test_dispatch.py)."""
    made = Problem.of(KEY, Target("gfx950", 256, "cuda"), max_model_len=8192)
    for target in (Target.described("gfx950", 256), Target("gfx950", 256, "cpu"), Target("gfx950", 256, "meta", True)):
        assert Problem.of(KEY, target, max_model_len=8192) == made
    assert not {f.name for f in dataclasses.fields(Problem)} & set(TARGET_ONLY_FIELDS)
    assert Problem.of(KEY, Target("gfx942", 256, "cuda"), max_model_len=8192) != made


def test_problem_records_load_with_and_without_the_target_fields():
    """AOT manifests store ``asdict(problem)``; those written while problems carried the device
    type and ``hypothetical`` still load, with those keys ignored."""
    problem = Problem.of(KEY, Target("gfx950", 256, "cuda"), context=4096, max_model_len=8192, kv_block_stride=8448)
    record = dataclasses.asdict(problem)
    assert Problem.from_record(record) == problem
    assert Problem.from_record({**record, "device_type": "cuda", "hypothetical": True}) == problem
    with pytest.raises(TypeError):
        Problem.from_record({**record, "devices": 1})  # anything else is still an error


def test_problem_records_of_the_flat_layout_load():
    """Manifests written while a problem held the key fields flat (no ``shape_key``; the oldest
    without ``kv_format``/``logits_dtype`` either) load as the same problem."""
    problem = Problem.of(KEY, Target("gfx950", 256, "cuda"), context=4096, max_model_len=8192, kv_block_stride=8448)
    flat = {"arch": "gfx950", "cu_num": 256, "batch": 8, "next_n": 2, "heads": 64, "head_dim": 128,
            "kv_block_size": 64, "preshuffle": True, "context": 4096, "lens_2d": True, "fp8": "fn",
            "max_model_len": 8192, "kv_block_stride": 8448, "kv_base_aligned": True, "kv_32bit": True}
    assert Problem.from_record(flat) == problem
    assert Problem.from_record({**flat, "kv_format": "fp8", "logits_dtype": "fp32", "device_type": "cuda",
                                "hypothetical": False}) == problem
    bf16 = Problem.from_record({**flat, "logits_dtype": "bf16"})
    assert bf16.shape_key == dataclasses.replace(KEY, logits_dtype="bf16")


def test_a_called_problem_has_its_key_and_the_call_its_target():
    inp = make_inputs(2, 2, 32, [20, 9], kv_block_size=16)
    args = build_launch_args(*positional(inp))
    assert args.problem.shape_key == ShapeKey(heads=32, head_dim=128, kv_block_size=16, preshuffle=False, batch=2,
                                              next_n=2)
    assert args.target == Target("cpu", 0, "cpu", hypothetical=False)  # the tensors' device type


def test_problem_layout_and_context_properties():
    packed = Problem.of(KEY, Target("sm_90", 132, "cuda"), max_model_len=8192)
    assert packed.kv_stride_bytes == 64 * 132 and packed.kv_aligned16
    padded = dataclasses.replace(packed, kv_block_stride=64 * 132 + 4)
    assert padded.kv_stride_bytes == 64 * 132 + 4 and not padded.kv_aligned16
    assert not dataclasses.replace(packed, kv_base_aligned=False).kv_aligned16
    assert packed.work_context == 8192  # no hint: the output width
    assert dataclasses.replace(packed, context=1000).work_context == 1000
    assert packed.describe() == ("arch=sm_90 cu_num=132 batch=8 next_n=2 heads=64 head_dim=128 kv_block_size=64 "
                                 "preshuffle=1 context=any")


# ----------------------------------------------------------------------------- helpers
def test_row_lengths_1d_and_2d():
    lens = torch.tensor([5, 1, 0], dtype=torch.int32)
    rl = row_lengths(lens, 3)
    assert rl.tolist() == [[3, 4, 5], [0, 0, 1], [0, 0, 0]]
    lens2d = torch.tensor([[3, 9], [-2, 4]], dtype=torch.int32)
    assert row_lengths(lens2d, 2).tolist() == [[3, 9], [0, 4]]


def test_fp8_flavours_round_trip():
    for flavour in ("fn", "fnuz"):
        assert fp8_flavour(fp8_dtype(flavour)) == flavour
    assert fp8_dtype("fnuz") == torch.float8_e4m3fnuz
    with pytest.raises(ValueError, match="not an fp8 e4m3 dtype"):
        fp8_flavour(torch.float8_e5m2)


def test_kv_fits_32bit_counts_the_last_block_from_the_base():
    def cache(num_blocks, kv_block_size=64, stride0=None):  # meta: the sizes of a real cache, no memory
        row = 132
        return torch.empty_strided((num_blocks, kv_block_size, 1, row), (stride0 or kv_block_size * row, row, row, 1),
                                   dtype=torch.uint8, device="meta")

    limit = 2**31 - 1
    block = 64 * 132
    fits = (limit - 1 - block) // block + 1  # the most blocks whose last byte stays below the limit
    assert kv_fits_32bit(cache(fits)) and not kv_fits_32bit(cache(fits + 1))
    assert kv_fits_32bit(cache(0)) and kv_fits_32bit(cache(1))
    # a padded block stride moves every block but the first
    assert not kv_fits_32bit(cache(fits, stride0=block + 256))
