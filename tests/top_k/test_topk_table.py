"""Top-k rows in the tuned tables: the ``op`` column (absent: ``mqa_logits``), the top-k key and
its lookup rules, the writer's round trip of mixed files, and the op's dispatch through them."""

import pytest
import torch

from paged_mqa_logits import reload_tuned_table, table, topk
from paged_mqa_logits.problem import ShapeKey, TopkKey
from paged_mqa_logits.table import Row, TableError, TableWriter
from paged_mqa_logits.top_k import backends

TOPK_HEADER = "arch,cu_num,op,rows,k,logits_dtype,context,backend,BLOCK,num_warps,split,us,provenance\n"
LOGITS_ROW = "gfx950,256,32,128,64,1,64,1,any,flydsl,128,4,0,,1,p\n"
LOGITS_HEADER = "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,SplitKV,variant,us,provenance\n"


def topk_row(rows, k, context, backend="triton_radix", knobs=(), arch="sm_90", cu_num=132, us=1.0, dtype="fp32"):
    return Row(arch, cu_num, TopkKey(rows=rows, k=k, logits_dtype=dtype), context, backend, tuple(sorted(knobs)), us,
               "tuned:test", "")


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """Point the loader at files written by the test; reload before and after."""
    def use(*texts):
        paths = []
        for i, text in enumerate(texts):
            path = tmp_path / f"t{i}_tuned.csv"
            path.write_text(text)
            paths.append(str(path))
        monkeypatch.setenv(table.ENV_CONFIGS, ":".join(paths))
        reload_tuned_table()
        return paths
    yield use
    monkeypatch.delenv(table.ENV_CONFIGS, raising=False)
    reload_tuned_table()


def test_a_file_without_the_op_column_reads_as_logits_rows(tables):
    path, = tables(LOGITS_HEADER + LOGITS_ROW)
    row, = table.parse_file(path)
    assert row.op == "mqa_logits" and isinstance(row.shape_key, ShapeKey)


def test_topk_rows_parse_and_look_up(tables):
    text = (TOPK_HEADER
            + "sm_90,132,topk,64,2048,,8192,triton,512,4,,3.0,tuned:a\n"
            + "sm_90,132,topk,64,2048,,131072,triton_radix,1024,8,2,9.0,tuned:a\n"
            + "sm_90,132,topk,1024,2048,,any,triton_radix,2048,16,,20.0,tuned:a\n"
            + "sm_90,132,topk,64,512,,8192,torch,,,,30.0,tuned:a\n")
    tables(text)
    key = TopkKey(rows=64, k=2048)
    exact = table.lookup_topk("sm_90", 132, key, 8192)
    assert exact.row.backend == "triton" and exact.row.knobs == {"BLOCK": 512, "num_warps": 4}
    assert exact.rule == "exact row"
    near = table.lookup_topk("sm_90", 132, TopkKey(rows=48, k=2048), 100000)
    assert near.row.backend == "triton_radix" and near.row.knobs["split"] == 2
    assert "nearest tuned row (k 2048, rows 64, context 131072)" in near.rule
    agnostic = table.lookup_topk("sm_90", 114, TopkKey(rows=900, k=2048, logits_dtype="bf16"), 4096)
    assert agnostic.row.shape_key.rows == 1024 and agnostic.row.context is None
    assert "rows of fp32 logits" in agnostic.rule and "rows of cu_num 132 (device has 114)" in agnostic.rule
    assert table.lookup_topk("sm_90", 132, TopkKey(rows=64, k=500), 8192).row.backend == "torch"
    assert table.lookup_topk("gfx950", 256, key, 8192).row is None
    # the logits op never sees top-k rows
    assert all(fields["arch"] != "sm_90" or "rows" not in fields for fields, _, _ in table.table_configs("sm_90"))


def test_one_file_may_hold_both_ops_and_round_trips(tmp_path):
    logits = Row("gfx950", 256, ShapeKey(heads=32, head_dim=128, kv_block_size=64, preshuffle=True, batch=1, next_n=1),
                 None, "flydsl", (("ChunkK", 128), ("SplitKV", 0), ("WavePerEU", 4)), 1.0, "p", "")
    rows = [logits, topk_row(64, 2048, 8192, knobs=(("BLOCK", 1024), ("split", 4))), topk_row(8, 16, None, "torch")]
    path = str(tmp_path / "mixed_tuned.csv")
    TableWriter.for_rows(rows).write(path, rows)
    header = open(path).readline().strip().split(",")
    assert header[:3] == ["arch", "cu_num", "op"] and {"rows", "k", "heads", "BLOCK", "split"} <= set(header)
    def seen(rs):
        return {(r.key, r.backend, tuple(sorted(r.knobs.items())), r.us) for r in rs}
    assert seen(table.parse_file(path)) == seen(rows)
    only_topk = str(tmp_path / "topk_tuned.csv")
    TableWriter.for_rows(rows[1:]).write(only_topk, rows[1:])
    assert open(only_topk).readline().strip() == ("arch,cu_num,op,rows,k,logits_dtype,context,backend,BLOCK,split,"
                                                   "us,provenance")
    assert {r.key for r in table.parse_file(only_topk)} == {r.key for r in rows[1:]}


@pytest.mark.parametrize("line,message", [
    ("sm_90,132,sort,64,2048,,8192,triton,,,,1,p", "column op must be one of mqa_logits, topk, got 'sort'"),
    ("sm_90,132,topk,64,2048,,8192,gluon,,,,1,p", "column backend must be one of torch, triton, triton_radix"),
    ("sm_90,132,topk,0,2048,,8192,triton,,,,1,p", "column rows must be >= 1, got 0"),
    ("sm_90,132,topk,64,x,,8192,triton,,,,1,p", "column k must be an integer, got 'x'"),
    ("sm_90,132,topk,64,2048,,8192,triton,500,,,1,p", r"knob BLOCK of top-k backend triton must be one of \(32"),
    ("sm_90,132,topk,64,2048,,8192,torch,64,,,1,p", "knob BLOCK is no knob of top-k backend torch"),
    ("sm_90,132,mqa_logits,64,2048,,8192,triton,,,,1,p", "a row of op mqa_logits needs column"),
])
def test_bad_topk_rows_name_file_line_column(tmp_path, line, message):
    path = tmp_path / "bad_tuned.csv"
    path.write_text(TOPK_HEADER + line + "\n")
    with pytest.raises(TableError, match=f"^{path}:2: {message}"):
        table.parse_file(str(path))


def test_the_op_dispatches_through_the_table_and_caches(tables):
    logits = torch.randn(4, 300)
    lengths = torch.tensor([300, 150], dtype=torch.int32)
    expected = topk(logits, lengths, 16, next_n=2, backend="torch").sort(1).values
    path, = tables(TOPK_HEADER + "cpu,0,topk,4,16,,256,triton_radix,32,,2,1.0,tuned:test\n")
    got = topk(logits, lengths, 16, next_n=2).sort(1).values
    choice = next(c for (arch, _, key, width), c in backends.decisions().items()
                  if arch == "cpu" and key == TopkKey(rows=4, k=16) and width == 300)
    assert choice.backend == "triton_radix" and choice.config == {"BLOCK": 32, "split": 2}
    assert "nearest tuned row (k 16, rows 4, context 256)" in choice.rule
    assert torch.equal(got, expected)
    with open(path, "w") as f:  # a reloaded table is a new cache: no rows now -> the default
        f.write(TOPK_HEADER)
    reload_tuned_table()
    topk(logits, lengths, 16, next_n=2)
    assert [c.backend for (arch, _, key, width), c in backends.decisions().items() if key.k == 16] == ["torch"]


def test_untuned_default_is_todays_rule(tables):
    tables(TOPK_HEADER)
    for arch, backend in (("cpu", "torch"), ("sm_90", "triton_sample"), ("gfx942", "triton_sample"),
                          ("gfx950", "triton_sample")):
        choice = backends.decide(arch, 132, TopkKey(rows=64, k=2048), 8192)
        assert choice.backend == backend and choice.source == "defaults"
    assert backends.decide("sm_90", 132, TopkKey(rows=64, k=2048), 8192).config == {"BLOCK": 8192, "num_warps": 8}


def test_untuned_sample_knobs_follow_the_rows(tables):
    """``triton_sample``'s defaults on a GPU: the large block over 8 warps while the rows fit the SMs (a
    program an SM), the small block over 4 warps once they outnumber them; a table row's knobs override
    either; the tuner times the call's default first."""
    from paged_mqa_logits.top_k import knobs

    tables(TOPK_HEADER)
    few, many = {"BLOCK": 8192, "num_warps": 8}, {"BLOCK": 2048, "num_warps": 4}
    for rows, expected in ((132, few), (133, many), (1024, many)):
        choice = backends.decide("sm_90", 132, TopkKey(rows=rows, k=2048), 8192)
        assert choice.config == expected, rows
        assert ("its knobs for more rows (133) than SMs (132)" in choice.rule) == (rows == 133), choice.rule
    assert backends.decide("gfx942", 304, TopkKey(rows=256, k=2048), 8192).config == few  # 256 rows < 304 CUs
    assert backends.decide("cpu", 0, TopkKey(rows=1024, k=2048), 8192).backend == "torch"
    assert knobs.default_config("triton_sample", True, 1024, 0) == {"BLOCK": 64}
    assert knobs.default_config("triton_radix", False, 1024, 132) == {"BLOCK": 1024, "num_warps": 8}
    assert knobs.candidates("triton_sample", False, 256, 8192, 132)[0] == many
    assert knobs.candidates("triton_sample", False, 64, 8192, 132)[0] == few
    # rows held whole (no wider than the block) run split 1 whatever is asked: the tuner times no split there
    held = knobs.candidates("triton_sample", False, 64, 8192, 132)
    assert all("split" not in c for c in held if c["BLOCK"] >= 8192)
    assert any(c.get("split", 1) > 1 for c in held if c["BLOCK"] < 8192)  # 8k rows listed in blocks of 2048-4096
    assert any(c.get("split", 1) > 1 for c in knobs.candidates("triton_sample", False, 64, 32768, 132))
    tables(TOPK_HEADER + "sm_90,132,topk,256,2048,fp32,8192,triton_sample,4096,,1,1.0,tuned:test\n")
    assert backends.decide("sm_90", 132, TopkKey(rows=256, k=2048), 8192).config == {
        "BLOCK": 4096, "num_warps": 4, "split": 1}
