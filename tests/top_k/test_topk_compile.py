"""The top-k kernels cross-compile on CPU for sm_90 and gfx942/gfx950 (the aot driver's
``compile_spec``), with the arguments a k 2048 call passes, page table on and off; on sm_90 the
kernels use no local memory. ``triton_sample``'s kernels compile for sm_90 in the default tier and
for every arch in the `full` one (tests/conftest.py)."""

from __future__ import annotations

import inspect

import pytest

triton = pytest.importorskip("triton")

from paged_mqa_logits.aot.compile import compile_spec  # noqa: E402
from paged_mqa_logits.backends.base import CompileSpec  # noqa: E402
from paged_mqa_logits.top_k import triton_portable, triton_radix  # noqa: E402
from paged_mqa_logits.triton_internals.version import parse_version  # noqa: E402

_POINTERS = {"logits_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*i32", "table_ptr": "*i32"}
#: int64 scratch lists (``triton_sample``'s packed entries)
_WIDE_POINTERS = ("entries_ptr", "parts_ptr")
_INTS = ("stride_row", "stride_col", "stride_lens_b", "stride_lens_j", "stride_out", "stride_table", "width", "k",
         "block_size")


def _spec(kernel, arch, has_table, extra_pointers=(), extra_ints=(), block=1024, warps=8, extra=None):
    """The kernel's signature as a k 2048 call specialises it (parameters it lacks are dropped)."""
    signature = dict(_POINTERS, **{p: "*i64" if p in _WIDE_POINTERS else "*i32" for p in extra_pointers})
    signature.update({name: "i32" for name in _INTS + tuple(extra_ints)})
    order = list(inspect.signature(kernel.fn).parameters)
    constexprs = {"NEXT_N": 2, "LENS_2D": True, "HAS_TABLE": has_table, "BLOCK": block, **(extra or {})}
    constexprs = {name: value for name, value in constexprs.items() if name in order}
    signature.update({name: "constexpr" for name in constexprs})
    signature = {name: signature[name] for name in order}
    options = {"num_warps": warps}
    if arch.startswith("gfx"):
        options["waves_per_eu"] = 1
    level = f"_{extra['LEVEL']}" if extra and "LEVEL" in extra else ""
    return CompileSpec(name=f"topk_{kernel.__name__}_{arch}_{int(has_table)}{level}", backend="topk", arch=arch, knobs={},
                       fn=kernel, signature=signature, constexprs=constexprs, options=options, gluon=False)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx950"])
@pytest.mark.parametrize("has_table", [False, True])
def test_radix_kernel_cross_compiles(arch, has_table):
    spec = _spec(triton_radix._topk_radix_kernel, arch, has_table, ["scratch_ptr"], ["capacity"],
                 triton_radix.BLOCK, triton_radix.NUM_WARPS)
    record = compile_spec(spec, None)
    assert record.ok, record.error
    if arch == "sm_90" and record.scratch_bytes is not None:
        assert record.scratch_bytes == 0


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_portable_kernel_cross_compiles(arch):
    record = compile_spec(_spec(triton_portable._topk_row_kernel, arch, True, block=triton_portable.BLOCK, warps=4),
                          None)
    assert record.ok, record.error


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_split_row_kernels_cross_compile(arch):
    split = {"SPLIT": 8}
    tables = ["total_ptr", "suffix_ptr", "scratch_ptr"]
    histograms = [_spec(triton_radix._chunk_histogram_kernel, arch, False, tables, ["capacity", "chunk"],
                        triton_radix.BLOCK, triton_radix.NUM_WARPS, extra=dict(split, LEVEL=level))
                  for level in (0, 1)]
    split_kernel = _spec(triton_radix._chunk_split_kernel, arch, True, tables, ["capacity", "chunk"],
                         triton_radix.BLOCK, triton_radix.NUM_WARPS, extra=split)
    resolve = _spec(triton_radix._chunk_resolve_kernel, arch, True, tables, ["capacity"], triton_radix.BLOCK,
                    triton_radix.NUM_WARPS, extra=split)
    for spec in (*histograms, split_kernel, resolve):
        record = compile_spec(spec, None)
        assert record.ok, f"{spec.name}: {record.error}"


def _sample_spec(kernel, arch, has_table, extra_pointers, extra_ints, extra):
    from paged_mqa_logits.top_k import triton_sample

    columns = triton_sample.LANE_ELEMENTS * 32 * triton_sample.NUM_WARPS
    constexprs = dict(STRIPES=triton_sample.BLOCK // columns, REGISTER_LIST=triton_sample.REGISTER_LIST,
                      LIST_BLOCK=columns, ROW=triton_sample.held_row_for(triton_sample.BLOCK, 131072, columns), **extra)
    if "PREFETCH" in kernel.arg_names:  # the kernels that compact
        constexprs["PREFETCH"] = triton_sample.prefetch_for(arch)
    if "IN_PLACE" in kernel.arg_names:  # the kernels that write a selection held in registers
        constexprs["IN_PLACE"] = triton_sample.in_place_for(arch)
    if "LIST_IN_PLACE" in kernel.arg_names:  # the kernels that compact, at k 2048 over rows of 131072
        constexprs["LIST_IN_PLACE"] = triton_sample.list_in_place_for(arch, 2048, 131072)
    if "LISTS" in kernel.arg_names:  # rows of 131072 are listed (unless the test asks otherwise)
        constexprs["LISTS"] = extra.get("LISTS", True)
    return _spec(kernel, arch, has_table, extra_pointers, extra_ints, triton_sample.BLOCK, triton_sample.NUM_WARPS,
                 extra=constexprs)


#: the Triton whose sm_90 register allocation ``triton_sample``'s sizes were chosen with: there it must
#: not spill; another version's spills are printed, not failed (Triton 3.9 spills 120 bytes of the
#: page-table kernel), as the Gluon compile tests treat theirs
CALIBRATED = parse_version(triton.__version__) == (3, 6)


def _assert_no_local_memory(record, name):
    if record.scratch_bytes:
        assert not CALIBRATED, f"{name}: {record.scratch_bytes} bytes of local memory"
        print(f"\n{name}: {record.scratch_bytes} bytes of local memory under Triton {triton.__version__}")


def _check_sample_kernel(arch, has_table):
    """``triton_sample``'s one-program kernel (seed, compaction, list finish, ``triton_radix``'s
    fallback) compiles; no local memory on sm_90 (under the calibrated Triton)."""
    from paged_mqa_logits.top_k import triton_sample

    spec = _sample_spec(triton_sample._topk_sample_kernel, arch, has_table, ["scratch_ptr", "entries_ptr"],
                        ["capacity"], {})
    record = compile_spec(spec, None)
    assert record.ok, record.error
    if arch == "sm_90":
        _assert_no_local_memory(record, spec.name)


def test_sample_kernel_cross_compiles_for_sm90():
    _check_sample_kernel("sm_90", True)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx950"])
@pytest.mark.parametrize("has_table", [False, True])
def test_sample_kernel_cross_compiles(arch, has_table):
    """Every arch, page table on and off (the `full` tier: each compile takes seconds)."""
    _check_sample_kernel(arch, has_table)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_sample_kernel_without_lists_cross_compiles(arch):
    """The kernel a call runs when every row is held whole (width at most the held row: ``LISTS`` off, the list
    path not compiled): no local memory on sm_90, and fewer registers than the kernel that lists."""
    from paged_mqa_logits.top_k import triton_sample

    records = []
    for lists in (False, True):
        spec = _sample_spec(triton_sample._topk_sample_kernel, arch, True, ["scratch_ptr", "entries_ptr"],
                            ["capacity"], {"LISTS": lists})
        spec.name += f"_lists{int(lists)}"
        record = compile_spec(spec, None)
        assert record.ok, record.error
        records.append(record)
    if arch == "sm_90":
        _assert_no_local_memory(records[0], "sample kernel without lists")
    assert records[0].vgprs < records[1].vgprs, (records[0].vgprs, records[1].vgprs)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "gfx950"])
def test_sample_split_row_kernels_cross_compile(arch):
    from paged_mqa_logits.top_k import triton_sample

    pointers = ["parts_ptr", "counts_ptr", "scratch_ptr", "entries_ptr"]
    specs = [_sample_spec(triton_sample._chunk_compact_kernel, arch, False, pointers, ["capacity", "chunk"],
                          {"SPLIT": 8}),
             _sample_spec(triton_sample._chunk_finish_kernel, arch, True, pointers, ["capacity"], {"SPLIT": 8})]
    for spec in specs:
        record = compile_spec(spec, None)
        assert record.ok, f"{spec.name}: {record.error}"
        if arch == "sm_90":
            _assert_no_local_memory(record, spec.name)
