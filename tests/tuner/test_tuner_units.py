"""The tuner's pieces without worker processes: key lists, candidate enumeration, the picks,
the table it writes (schema, lookup, atomic write, merge), the time budget's decisions, the
re-check verdicts, and --dry-run."""

import os

import pytest

from paged_mqa_logits import table
from paged_mqa_logits.bench import Impl, Measurement, Shape
from paged_mqa_logits.problem import Problem, ShapeKey, Target
from paged_mqa_logits.table import Row, TableWriter
from tuner import __main__ as cli
from tuner.candidates import Candidate, candidates_for, problem_for
from tuner.keys import TuneKey, coarse_to_fine, order_keys, read_untuned
from tuner.recheck import classify, points_for, read_baseline, recheck, tasks_for
from tuner.search import CheckStage, KeyRun, Options, TimeStage
from tuner.writer import merge, pick, provenance, rows_for, tuned_lengths, tuned_shape_keys, write_table

CPU = Target("cpu", 0, "cpu")


def shape_key(heads, head_dim, kv_block_size, preshuffle, batch, next_n):
    """A shape key written as a table row spells it (the columns in their order)."""
    return ShapeKey(heads=heads, head_dim=head_dim, kv_block_size=kv_block_size, preshuffle=preshuffle, batch=batch,
                    next_n=next_n)


KEY = TuneKey(shape_key(32, 128, 16, False, 4, 2), (64, 256))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- keys
def test_untuned_files_union_contexts_and_report_bad_lines(tmp_path):
    a = write(tmp_path, "a.csv", "# GLM-5\nheads,head_dim,kv_block_size,preshuffle,batch,next_n,contexts\n"
                                 "32,128,64,1,8,2,8192;32768\n32,128,64,0,1,1,\n")
    b = write(tmp_path, "b.csv", "heads,head_dim,kv_block_size,preshuffle,batch,next_n,contexts\n32,128,64,1,8,2,131072\n")
    keys = read_untuned([a, b])
    assert TuneKey(shape_key(32, 128, 64, True, 8, 2), (8192, 32768, 131072)) in keys
    assert TuneKey(shape_key(32, 128, 64, False, 1, 1), (8192, 32768)) in keys  # the default contexts
    assert {k.contexts for k in read_untuned([a], contexts=(100,))} == {(100,)}
    bad = write(tmp_path, "bad.csv", "heads,head_dim,kv_block_size,preshuffle,batch,next_n\n32,128,64,0,many,1\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: "):
        read_untuned([bad])
    with pytest.raises(ValueError, match="header lacks column"):
        read_untuned([write(tmp_path, "c.csv", "heads,batch\n32,1\n")])


def test_coarse_to_fine_covers_the_range_first():
    rank = coarse_to_fine([1, 2, 4, 8, 16, 32, 64, 128, 256])
    first = sorted(rank, key=rank.get)
    assert first[:3] == [1, 256, 16] and set(first) == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    keys = order_keys([TuneKey(shape_key(32, 128, 64, False, b, 1), (8192,)) for b in (64, 1, 256, 8)])
    assert [k.shape_key.batch for k in keys][:2] == [1, 256]


def test_shipped_untuned_lists():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
    glm = read_untuned([os.path.join(root, "glm5_untuned.csv")])
    dsv = read_untuned([os.path.join(root, "dsv32_untuned.csv")])
    compact = read_untuned([os.path.join(root, "sm_90_compact_untuned.csv")])
    assert {k.shape_key.heads for k in glm} == {32} and {k.shape_key.heads for k in dsv} == {64}
    for keys in (glm, dsv):
        assert {k.shape_key.batch for k in keys} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
        assert {k.shape_key.next_n for k in keys} == {1, 2, 3, 4, 8}
        assert {k.shape_key.preshuffle for k in keys} == {True, False}
        assert {k.shape_key.kv_block_size for k in keys} == {64}
        assert {k.contexts for k in keys} == {(8192, 32768, 131072)}
    assert {k.shape_key for k in compact} <= {k.shape_key for k in glm + dsv} and len(compact) < len(glm + dsv) / 2


# ----------------------------------------------------------------------------- candidates
def test_candidates_union_over_contexts_keep_the_default_and_name_who_cannot_serve():
    cands, skipped = candidates_for(KEY, CPU, ["torch", "triton", "gluon"])
    assert Candidate.of("torch", {}) in cands and any(c.backend == "triton" for c in cands)
    assert "gluon" in skipped  # no gluon on CPU tensors
    few, _ = candidates_for(KEY, CPU, ["triton"], max_candidates=2)
    from paged_mqa_logits.backends import get

    default = Candidate.of("triton", get("triton").default_config(problem_for(KEY, CPU, 256)))
    assert len(few) == 2 and default in few


# ----------------------------------------------------------------------------- picks and rows
def meas(us=None, status="ok"):
    return Measurement(Shape.of(32, 2, 4, 64), Impl("dispatch"), us=us, status=status)


def test_pick_per_context_and_geomean_any_row():
    cands = [Candidate.of("torch", {}), Candidate.of("triton", {"ChunkK": 32}), Candidate.of("triton", {"ChunkK": 64}),
             Candidate.of("fake", {"mode": "ok"})]
    results = {
        (64, 0, "screen"): meas(10.0), (256, 0, "screen"): meas(40.0),
        (64, 1, "screen"): meas(8.0), (256, 1, "screen"): meas(60.0), (64, 1, "confirm"): meas(9.0),
        (64, 2, "screen"): meas(5.0), (256, 2, "screen"): meas(status="FAIL: calc_diff 1e-2 >= 0.001"),
        (64, 3, "screen"): meas(1.0), (256, 3, "screen"): meas(1.0),  # fastest, but not a table backend
    }
    per_context, agnostic = pick(KEY, cands, results)
    assert per_context == {64: (1, 9.0), 256: (0, 40.0)}  # candidate 2 failed at 256: dropped everywhere
    assert agnostic[0] == 0 and agnostic[1] == pytest.approx((10.0 * 40.0) ** 0.5)  # 20 < sqrt(9*60)=23.2
    rows = rows_for(KEY, "cpu", 0, cands, results, "tuned:x")
    assert [(r.context, r.backend, r.knobs) for r in rows] == [
        (64, "triton", {"ChunkK": 32}), (256, "torch", {}), (None, "torch", {})]


def test_written_table_parses_and_serves_lookups(tmp_path):
    cands = [Candidate.of("gluon", {"variant": "mma_v2", "ChunkK": 64, "num_warps": 4, "Prefetch": False})]
    results = {(64, 0, "screen"): meas(3.0), (256, 0, "screen"): meas(12.0)}
    prov = provenance("NVIDIA H200", 132, "3.6.0", "2.13.0", date="2026-01-02")
    assert prov == "tuned:NVIDIA H200|cu132|triton3.6.0|torch2.13.0|2026-01-02"
    path = str(tmp_path / "sm_90_tuned.csv")
    write_table(path, rows_for(KEY, "sm_90", 132, cands, results, prov), comments=["a comment"])
    rows = table.parse_file(path)
    assert {r.context for r in rows} == {64, 256, None} and all(r.provenance == prov for r in rows)
    assert rows[0].knobs == {"variant": "mma_v2", "ChunkK": 64, "num_warps": 4, "Prefetch": 0}  # bools travel as 0/1
    os.environ[table.ENV_CONFIGS] = path
    try:
        table.reset()
        problem = Problem("sm_90", 132, ShapeKey(heads=32, head_dim=128, kv_block_size=16, preshuffle=False, batch=4, next_n=2),
                          None, True, "fn", 256)
        match = table.lookup(problem)
        assert match.row.context is None and match.rule.startswith("exact row")
        from dataclasses import replace

        assert table.lookup(replace(problem, context=200)).row.context == 256
    finally:
        del os.environ[table.ENV_CONFIGS]
        table.reset()


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = str(tmp_path / "t_tuned.csv")
    old = [Row("cpu", 0, shape_key(32, 128, 16, False, 1, 1), None, "torch", (), 1.0, "tuned:old", "")]
    write_table(path, old)
    before = open(path).read()
    calls, original = [], TableWriter.cells

    def failing_cells(self, row):  # the second row fails, after the first reached the file
        calls.append(row)
        if len(calls) > 1:
            raise OSError("disk full")
        return original(self, row)

    monkeypatch.setattr(TableWriter, "cells", failing_cells)
    new = old + [Row("cpu", 0, shape_key(32, 128, 16, False, 2, 1), None, "torch", (), 2.0, "tuned:new", "")]
    with pytest.raises(OSError, match="disk full"):
        write_table(path, new)
    assert open(path).read() == before and os.listdir(tmp_path) == ["t_tuned.csv"]


def test_merge_replaces_a_retuned_key_and_keeps_everything_else():
    def row(arch, batch, context, us):
        return Row(arch, 0, shape_key(32, 128, 16, False, batch, 1), context, "torch", (), us, "p", "")

    existing = [row("cpu", 1, 64, 1.0), row("cpu", 1, 999, 1.0), row("cpu", 2, None, 2.0), row("gfx950", 1, 64, 3.0)]
    new = [row("cpu", 1, 64, 0.5), row("cpu", 1, None, 0.5)]
    merged = merge(existing, new, {("cpu", 0, shape_key(32, 128, 16, False, 1, 1))})
    assert {(r.arch, r.shape_key.batch, r.context, r.us) for r in merged} == {
        ("cpu", 1, 64, 0.5), ("cpu", 1, None, 0.5), ("cpu", 2, None, 2.0), ("gfx950", 1, 64, 3.0)}
    assert len(merged) == 4
    contexts_of = {shape_key(32, 128, 16, False, 1, 1): (64,), shape_key(32, 128, 16, False, 2, 1): (64,)}
    # batch 2 has only an "any" row (as a prior has): not tuned, so a run tunes it and replaces the row
    assert tuned_shape_keys(merged, "cpu", 0, contexts_of) == {shape_key(32, 128, 16, False, 1, 1)}
    assert tuned_shape_keys(merged, "cpu", 8, contexts_of) == set()  # another CU count is another device


# ----------------------------------------------------------------------------- the time budget
class _Bar:
    def update(self, n):
        pass

    def reset(self, total):
        self.total = total


def test_check_stage_compiles_each_family_at_its_smallest_batch_first():
    cands = [Candidate.of("triton", {"ChunkK": c}) for c in (32, 64, 128, 256)]
    runs = [KeyRun(TuneKey(shape_key(32, 128, 16, pre, b, 1), (64, 128)), cands) for pre in (False, True) for b in (1, 8, 64)]
    stage = CheckStage(runs, jobs=2, bar=_Bar())
    tasks = [(t.shape.shape_key.preshuffle, t.shape.shape_key.batch, t.shape.context, len(t.impls))
             for t in stage.tasks]
    assert tasks == [(False, 1, 64, 2), (False, 1, 64, 2), (True, 1, 64, 2), (True, 1, 64, 2),
                     (False, 64, 64, 2), (False, 64, 64, 2), (True, 64, 64, 2), (True, 64, 64, 2)]
    assert all(t.workload == {"copies": 1} and t.screen is None for t in stage.tasks)  # check only


def test_budget_drops_the_confirm_stage_then_stops_starting_keys():
    runs = [KeyRun(TuneKey(shape_key(32, 128, 16, False, b, 1), (64, 128)), [Candidate.of("torch", {})] * 10)
            for b in (1, 2, 4)]
    stage = TimeStage(list(runs), Options(untuned=[], out="", top=3), CPU, "p", 1, None, _Bar(), lambda r: None)
    assert stage._plan(runs[0]) == 3  # no budget: always confirm
    import time

    stage.deadline = time.monotonic() + 1000
    assert stage._plan(runs[0]) == 3  # nothing measured yet: go
    stage.cost = {"screen": [1.0], "confirm": [2.0], "build": [1.0]}
    # per key: 2 contexts x (1 + 10 x 1 + 3 x 2) = 34 s full, 22 s lean; 3 keys left
    stage.deadline = time.monotonic() + 110
    assert stage._plan(runs[0]) == 3
    stage.deadline = time.monotonic() + 60
    assert stage._plan(runs[0]) == 0
    stage.deadline = time.monotonic() + 10
    assert stage._plan(runs[0]) is None
    assert stage.next_task() is None and len(stage.left) == 3


# ----------------------------------------------------------------------------- re-check
@pytest.mark.parametrize("measured,recorded,baseline,expected", [
    (10.0, 10.5, None, ("", "")),
    (12.0, 10.0, None, ("DRIFT slower 1.20x", "")),
    (8.0, 10.0, None, ("DRIFT faster 0.80x", "")),
    (10.0, None, 9.5, ("no recorded us", "ok")),
    (10.0, 10.0, 9.0, ("", "WARN 1.11x")),
    (10.0, 10.0, 8.6, ("", "FAIL 1.16x")),
    (None, 10.0, 8.0, ("not measured", "")),
])
def test_recheck_verdicts(measured, recorded, baseline, expected):
    assert classify(measured, recorded, baseline) == expected


def test_recheck_points_and_baselines(tmp_path):
    def row(cu, batch, context, us=5.0):
        return Row("sm_90", cu, shape_key(64, 128, 64, False, batch, 1), context, "triton", (), us, "p", "")

    rows = [row(132, 1, 8192), row(132, 1, 32768), row(132, 1, None), row(114, 1, None)]
    points, note = points_for(rows, "sm_90", 132)
    assert note == "" and [(p.row.context, p.contexts) for p in points] == [
        (8192, (8192,)), (32768, (32768,)), (None, (8192, 32768))]
    points, note = points_for(rows, "sm_90", 120)
    assert "cu_num 114" in note and len(points) == 1
    assert points_for(rows, "gfx950", 256)[0] == []
    path = str(tmp_path / "old.csv")
    write_table(path, rows)
    assert read_baseline(path)[rows[0].key] == 5.0
    report = write(tmp_path, "r.csv",
                   "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,measured_us\n"
                   "sm_90,132,64,128,64,0,1,1,any,4.5\n")
    assert read_baseline(report) == {rows[2].key: 4.5}


def test_rows_record_the_lengths_they_were_tuned_with_and_recheck_times_them_so(tmp_path):
    wide = provenance("H200", 132, "3.6.0", "2.11", "2026-12-01", lengths="wide")
    uniform = provenance("H200", 132, "3.6.0", "2.11", "2026-12-01")
    assert wide == uniform + "|lengths=wide" and tuned_lengths(wide) == "wide" and tuned_lengths(uniform) == ""
    assert tuned_lengths("prior:upstream picks") == ""

    def row(context, prov):
        return Row("sm_90", 132, shape_key(64, 128, 64, False, 8, 1), context, "triton", (), 5.0, prov, "")

    points, _ = points_for([row(8192, wide), row(32768, uniform)], "sm_90", 132)
    work = [(p, c) for p in points for c in p.contexts]
    assert [t.shape.ragged for t in tasks_for(work, None, 4, None)] == ["wide", ""]
    assert [t.shape.ragged for t in tasks_for(work, None, 4, "wide")] == ["wide", "wide"]
    assert [t.shape.ragged for t in tasks_for(work, None, 4, "")] == ["", ""]


@pytest.mark.parametrize("baseline_text", [
    "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,SplitKV,us,"
    "provenance\n",  # header only
    "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,measured_us\n",  # an empty report
    "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,SplitKV,us,"
    "provenance\ncpu,0,64,128,64,0,999,1,32,torch,,,,1.0,p\n",  # rows, but none of the table's
])
def test_a_baseline_covering_no_checked_row_fails_the_recheck_before_timing(tmp_path, capsys, baseline_text):
    tuned = str(tmp_path / "cpu_tuned.csv")
    write_table(tuned, [Row("cpu", 0, shape_key(64, 128, 64, False, 1, 1), 32, "torch", (), 1.0, "p", "")])
    baseline = write(tmp_path, "baseline.csv", baseline_text)
    assert recheck(tuned, baseline=baseline, fail_on_regression=True, device="cpu", replays=1, quiet=True) == 1
    captured = capsys.readouterr()
    assert "covers none of the 1 row(s) checked" in captured.err and "[recheck] 1 rows" not in captured.out


def test_a_torn_report_baseline_names_its_row(tmp_path):
    report = write(tmp_path, "r.csv", "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,"
                                      "measured_us\nsm_90,132,64,128,64,0,1,1,any,4.5\nsm_90,132,64\n")
    with pytest.raises(ValueError, match="r.csv: report row 3: expected 10 cells"):
        read_baseline(report)


# ----------------------------------------------------------------------------- CLI
def test_dry_run_lists_candidates_for_another_target(tmp_path, capsys):
    keys = write(tmp_path, "k.csv", "heads,head_dim,kv_block_size,preshuffle,batch,next_n\n64,128,64,0,32,2\n")
    rc = cli.main([keys, "-o", str(tmp_path / "out.csv"), "--dry-run", "--arch", "sm90", "--cu-num", "132",
                   "--backends", "triton,torch", "--contexts", "8192"])
    out = capsys.readouterr().out
    assert rc == 0 and "batch=32 next_n=2 contexts=8192" in out and "triton[ChunkK=" in out
    assert "1 key(s) to tune on sm_90/cu132" in out and not os.path.exists(tmp_path / "out.csv")
    assert cli.main([keys, "-o", str(tmp_path / "out.csv"), "--backends", "nonesuch", "--dry-run"]) != 0


def test_keys_carry_the_format_and_logits_dtype_into_candidates_and_rows(tmp_path, capsys):
    path = write(tmp_path, "f.csv", "heads,head_dim,kv_block_size,preshuffle,batch,next_n,kv_format,logits_dtype,"
                                    "contexts\n64,128,64,0,8,1,fp4,bf16,8192\n64,128,64,0,8,1,,,8192\n")
    fp4, fp8 = read_untuned([path])
    assert (fp4.shape_key.kv_format, fp4.shape_key.logits_dtype) == ("fp4", "bf16")
    assert (fp8.shape_key.kv_format, fp8.shape_key.logits_dtype) == ("fp8", "fp32")
    assert fp4.family != fp8.family  # tuned separately: their kernels differ
    sm90 = Target.described("sm_90", 132)
    cands, skipped = candidates_for(fp4, sm90, ["gluon", "triton"])
    assert {c.backend for c in cands} == {"gluon", "triton"}  # sm_90's gluon reads fp4 in its fp4 variant only
    assert {dict(c.config)["variant"] for c in cands if c.backend == "gluon"} == {"wgmma_fp4"}
    cands, skipped = candidates_for(fp4, Target.described("gfx942", 304), ["gluon", "triton"])
    assert {c.backend for c in cands} == {"triton"} and "fp4" in skipped["gluon"]
    assert problem_for(fp4, sm90, 8192).shape_key.kv_format == "fp4"
    out = str(tmp_path / "again.csv")
    from tuner.keys import write_untuned

    write_untuned(out, [fp4])
    assert read_untuned([out]) == [fp4]
    rc = cli.main([path, "--dry-run", "--arch", "sm90", "--cu-num", "132", "--backends", "triton"])
    assert rc == 0 and "kv_format=fp4 logits_dtype=bf16" in capsys.readouterr().out
