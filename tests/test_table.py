"""Tuned-table parsing, merging, the lookup rules and the table configs."""

import dataclasses
import os

import pytest

from paged_mqa_logits import reload_tuned_table, table
from paged_mqa_logits.errors import PagedMQAEnvironmentError
from paged_mqa_logits.problem import Problem, ShapeKey
from table_files import HEADER, use, write


def problem(arch="gfx950", cu=256, batch=64, next_n=1, heads=32, context=None, pre=True, kv_block_size=64):
    key = ShapeKey(heads=heads, head_dim=128, kv_block_size=kv_block_size, preshuffle=pre, batch=batch, next_n=next_n)
    return Problem(arch=arch, cu_num=cu, shape_key=key, context=context, lens_2d=True, fp8="fn", max_model_len=32768)


def test_parse_rows_comments_and_knobs(tmp_path):
    path = write(tmp_path, "a_tuned.csv", [
        "# a comment line", "",
        "gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,31.1,prior:test",
        "gfx950,256,32,128,64,1,64,1,8192,triton,64,,,8,30.2,tuned:x",
    ])
    rows = table.parse_file(path)
    assert [r.source for r in rows] == [f"{path}:4", f"{path}:5"]
    assert rows[0].context is None and rows[1].context == 8192
    assert rows[0].knobs == {"ChunkK": 128, "WavePerEU": 4, "SplitKV": 0}
    assert rows[1].knobs == {"ChunkK": 64, "num_warps": 8}
    assert rows[0].shape_key.preshuffle is True and rows[0].us == pytest.approx(31.1)


def test_a_table_saved_with_a_byte_order_mark_loads(tmp_path):
    """Spreadsheet exports start the file with a UTF-8 BOM; it is not part of the first column's name."""
    path = write(tmp_path, "bom_tuned.csv", ["gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,31.1,prior:test"],
                 header="\ufeff" + HEADER)
    assert open(path, "rb").read(3) == b"\xef\xbb\xbf"
    (row,) = table.parse_file(path)
    assert row.arch == "gfx950" and row.knobs == {"ChunkK": 128, "WavePerEU": 4, "SplitKV": 0}


@pytest.mark.parametrize("line,message", [
    ("gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,31.1", "expected 16 cells, got 15"),
    ("gfx950,256,32,128,64,1,sixty,1,any,gluon,128,4,0,,1,p", "column batch must be an integer, got 'sixty'"),
    ("gfx950,256,32,128,64,2,64,1,any,gluon,128,4,0,,1,p", "column preshuffle must be 0 or 1"),
    ("gfx950,256,32,128,64,1,64,1,any,cuda,128,4,0,,1,p", "column backend must be one of"),
    ("gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,fast,p", "column us must be a number"),
    ("gfx950,256,32,128,64,1,0,1,any,gluon,128,4,0,,1,p", "column batch must be >= 1, got 0"),
    (",256,32,128,64,1,64,1,any,gluon,128,4,0,,1,p", "column arch is empty"),
])
def test_malformed_rows_report_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "bad_tuned.csv", ["# ok", line])
    with pytest.raises(table.TableError, match=f"^{path}:3: {message}"):
        table.parse_file(path)


def test_malformed_header(tmp_path):
    path = write(tmp_path, "h_tuned.csv", [], header="# c\narch,cu_num,heads\n")
    with pytest.raises(table.TableError, match=f"^{path}:2: header lacks column"):
        table.parse_file(path)
    empty = tmp_path / "e_tuned.csv"
    empty.write_text("# nothing\n")
    with pytest.raises(table.TableError, match="no header line"):
        table.parse_file(str(empty))


def test_merge_dedup_fastest_within_file_later_file_wins(tmp_path, monkeypatch):
    a = write(tmp_path, "a_tuned.csv", [
        "gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,40,p",
        "gfx950,256,32,128,64,1,64,1,any,gluon,256,2,0,,30,p",  # same key, faster: wins in file a
        "gfx950,256,32,128,64,1,64,1,any,gluon,64,1,0,,,p",  # no us: loses
        "gfx950,256,32,128,64,1,8,1,any,gluon,64,4,0,,5,p",
    ])
    b = write(tmp_path, "b_tuned.csv", ["gfx950,256,32,128,64,1,8,1,any,flydsl,,2,,,9,p"])
    merged = table.merge([a, b])
    assert len(merged) == 2
    key64, key8 = (("gfx950", 256, ShapeKey(heads=32, head_dim=128, kv_block_size=64, preshuffle=True, batch=b,
                                            next_n=1), None) for b in (64, 8))
    assert merged[key64].knobs["ChunkK"] == 256 and merged[key64].source == f"{a}:3"
    assert merged[key8].backend == "flydsl"  # later file replaces, even if slower


def test_env_path_list_default_token_directory_and_alias(tmp_path, monkeypatch):
    mine = write(tmp_path, "mine_tuned.csv", ["gfx950,256,32,128,64,1,64,1,any,gluon,64,1,0,,1,p"])
    use(monkeypatch, "default", mine)
    assert table.loaded_files() == table.shipped_files() + [mine]
    use(monkeypatch, str(tmp_path))
    assert table.loaded_files() == [mine]
    monkeypatch.delenv("PAGED_MQA_LOGITS_CONFIGS")
    monkeypatch.setenv("AITER_CONFIG_PAGED_MQA_LOGITS", mine)
    reload_tuned_table()
    assert table.loaded_files() == [mine]
    monkeypatch.setenv("AITER_CONFIG_PAGED_MQA_LOGITS", str(tmp_path / "missing.csv"))
    reload_tuned_table()
    with pytest.raises(PagedMQAEnvironmentError,
                       match="environment variable AITER_CONFIG_PAGED_MQA_LOGITS: .*missing.csv.*no file or directory"):
        table.loaded_files()


def test_a_table_that_cannot_be_read_is_the_packages_error_naming_it(tmp_path, monkeypatch):
    unreadable = tmp_path / "dir_tuned.csv"
    unreadable.mkdir()  # the directory's *_tuned.csv glob picks it up; opening it fails
    use(monkeypatch, str(tmp_path))
    with pytest.raises(table.TableError, match=f"^{unreadable}: cannot read it"):
        table.loaded_files()


def test_lookup_rules(tmp_path, monkeypatch):
    path = write(tmp_path, "t_tuned.csv", [
        "gfx950,256,32,128,64,1,8,1,any,gluon,64,4,0,,1,p",
        "gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,1,p",
        "gfx950,256,32,128,64,1,32,1,8192,gluon,256,1,0,,1,p",
        "gfx950,256,32,128,64,1,32,1,32768,gluon,256,2,0,,1,p",
        "gfx950,256,32,128,64,1,128,1,8192,flydsl,,1,,,1,p",
    ])
    use(monkeypatch, path)
    m = table.lookup(problem(batch=64))
    assert m.row.source == f"{path}:3" and m.rule == "exact row (across contexts)"
    m = table.lookup(problem(batch=20))  # log2 distance: |4.32-3| > |4.32-6|? 8 -> 1.32, 64 -> 1.68
    assert m.row.shape_key.batch == 8 and "nearest tuned batch 8" in m.rule
    m = table.lookup(problem(batch=23))  # 23 is exactly between 8 and 64 in log2 -> tie goes larger
    assert m.row.shape_key.batch == 64
    m = table.lookup(problem(batch=32, context=9000))
    assert m.row.context == 8192 and m.rule.startswith("nearest tuned row (batch 32, context 8192)")
    m = table.lookup(problem(batch=32, context=32768))
    assert m.row.context == 32768 and m.rule == "exact row"
    m = table.lookup(problem(batch=100, context=20000))  # batch 128 nearest among context rows
    assert m.row.shape_key.batch == 128 and m.row.backend == "flydsl"
    m = table.lookup(problem(next_n=2))
    assert m.row is None and "no tuned row" in m.rule
    m = table.lookup(problem(cu=304, batch=64))  # other cu_num: nearest tuned cu_num, said so
    assert m.row.shape_key.batch == 64 and "rows of cu_num 256 (device has 304)" in m.rule


def test_only_context_rows_without_hint_fall_to_defaults(tmp_path, monkeypatch):
    path = write(tmp_path, "c_tuned.csv", ["gfx950,256,32,128,64,1,32,1,8192,gluon,256,1,0,,1,p"])
    use(monkeypatch, path)
    m = table.lookup(problem(batch=32))
    assert m.row is None and "no context_hint" in m.rule


def test_table_configs(tmp_path, monkeypatch):
    path = write(tmp_path, "x_tuned.csv", [
        "gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,1,p",
        "sm_90,132,64,128,64,0,1,1,any,triton,64,,0,4,1,p",
    ])
    use(monkeypatch, path)
    configs = table.table_configs("sm90")
    assert configs == [({"arch": "sm_90", "cu_num": 132, "heads": 64, "head_dim": 128, "kv_block_size": 64,
                         "preshuffle": False, "batch": 1, "next_n": 1, "kv_format": "fp8", "logits_dtype": "fp32",
                         "context": None}, "triton",
                        {"ChunkK": 64, "SplitKV": 0, "num_warps": 4})]


def test_an_estimate_in_the_provenance_is_parsed_and_kept_apart_from_the_origin(tmp_path):
    estimate = "estimate:cdna-cycles-1 ours=812 aiter-default=1650 aiter-best=- cycles/64-keys bound=mfma"
    path = write(tmp_path, "e_tuned.csv", [
        f"gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,,prior:upstream pick; {estimate}",
        f"gfx950,256,32,128,64,1,8,1,any,gluon,128,4,0,,,{estimate}",
        "gfx950,256,32,128,64,1,1,1,any,gluon,128,4,0,,,prior:no estimate",
    ])
    first, second, third = table.parse_file(path)
    assert first.estimate == table.CycleEstimate("cdna-cycles-1", 812, 1650, None, "mfma")
    assert first.estimate.text() == estimate and second.estimate == first.estimate
    assert table.CycleEstimate.strip(first.provenance) == "prior:upstream pick"
    assert third.estimate is None and first.us is None


@pytest.mark.parametrize("provenance", [
    "estimate:m ours=fast aiter-default=1 aiter-best=1 cycles/64-keys bound=mfma",
    "prior:x; estimate:m ours=1 aiter-default=1 cycles/64-keys bound=mfma",
    "prior:x; estimate:m ours=1 aiter-default=1 aiter-best=1 cycles/64-keys bound=mfma trailing",
])
def test_a_malformed_estimate_names_the_column_and_the_expected_form(tmp_path, provenance):
    path = write(tmp_path, "bad_tuned.csv", ["# ok", f"gfx950,256,32,128,64,1,64,1,any,gluon,128,4,0,,,{provenance}"])
    with pytest.raises(table.TableError, match=f"^{path}:3: column provenance: an estimate must read 'estimate:<model> "):
        table.parse_file(path)


# ----------------------------------------------------------------------------- format columns
FORMAT_HEADER = HEADER.replace("next_n,context", "next_n,kv_format,logits_dtype,context")


def test_format_columns_parse_and_tables_without_them_mean_fp8_and_fp32(tmp_path):
    path = write(tmp_path, "f_tuned.csv", [
        "sm_90,132,64,128,64,0,1,1,fp4,bf16,any,triton,64,,0,4,1,p",
        "sm_90,132,64,128,64,0,1,1,,,any,triton,64,,0,4,1,p",  # empty cells: the defaults
    ], header=FORMAT_HEADER)
    fp4, plain = table.parse_file(path)
    assert (fp4.shape_key.kv_format, fp4.shape_key.logits_dtype) == ("fp4", "bf16")
    assert (plain.shape_key.kv_format, plain.shape_key.logits_dtype) == ("fp8", "fp32") and fp4.family != plain.family
    old = write(tmp_path, "o_tuned.csv", ["sm_90,132,64,128,64,0,1,1,any,triton,64,,0,4,1,p"])
    assert table.parse_file(old)[0].shape_key == plain.shape_key
    for shipped in table.shipped_files():  # every shipped table still loads: fp8 rows, and fp4 rows of a backend reading it
        rows = [r for r in table.parse_file(shipped) if r.op == table.DEFAULT_OP]  # top-k rows have no formats
        assert {(r.shape_key.kv_format, r.shape_key.logits_dtype) for r in rows} <= {("fp8", "fp32"), ("fp4", "fp32")}
        assert {r.backend for r in rows if r.shape_key.kv_format == "fp4"} <= {"triton", "flydsl", "gluon"}


@pytest.mark.parametrize("cells,message", [("fp5,fp32", "column kv_format must be one of fp8, fp4, got 'fp5'"),
                                           ("fp4,f16", "column logits_dtype must be one of fp32, bf16, got 'f16'")])
def test_malformed_format_cells_report_file_and_line(tmp_path, cells, message):
    path = write(tmp_path, "b_tuned.csv", [f"sm_90,132,64,128,64,0,1,1,{cells},any,triton,64,,0,4,1,p"],
                 header=FORMAT_HEADER)
    with pytest.raises(table.TableError, match=f"^{path}:2: {message}$"):
        table.parse_file(path)


def test_written_tables_carry_the_format_columns_and_read_back(tmp_path):
    path = write(tmp_path, "w_tuned.csv", ["sm_90,132,64,128,64,0,1,1,fp4,bf16,any,triton,64,,0,4,1,p"],
                 header=FORMAT_HEADER)
    rows = table.parse_file(path)
    out = str(tmp_path / "again_tuned.csv")
    table.TableWriter.for_rows(rows).write(out, rows)
    assert "kv_format,logits_dtype" in open(out).read().splitlines()[0]
    assert [r.shape_key for r in table.parse_file(out)] == [r.shape_key for r in rows]


def test_lookup_keeps_formats_apart_and_bf16_falls_back_to_fp32_rows(tmp_path, monkeypatch):
    path = write(tmp_path, "l_tuned.csv", [
        "gfx950,256,32,128,64,1,64,1,fp8,fp32,any,gluon,128,4,0,,1,p",
        "gfx950,256,32,128,64,1,64,1,fp4,fp32,any,triton,64,,0,4,1,p",
    ], header=FORMAT_HEADER)
    use(monkeypatch, path)
    plain = problem()
    fp4 = dataclasses.replace(plain, shape_key=dataclasses.replace(plain.shape_key, kv_format="fp4"))
    assert table.lookup(fp4).row.backend == "triton"
    assert table.lookup(problem()).row.backend == "gluon"
    bf16 = table.lookup(dataclasses.replace(plain, shape_key=dataclasses.replace(plain.shape_key, logits_dtype="bf16")))
    assert bf16.row.backend == "gluon" and bf16.rule.endswith("rows of fp32 logits")
    fp4_bf16 = dataclasses.replace(fp4, shape_key=dataclasses.replace(fp4.shape_key, logits_dtype="bf16"))
    assert table.lookup(fp4_bf16).row.backend == "triton"
    plain_fp4 = dataclasses.replace(plain, shape_key=dataclasses.replace(plain.shape_key, kv_format="fp4", next_n=2))
    assert table.lookup(plain_fp4).row is None


# ----------------------------------------------------------------------------- knobs that never vary
OLD_SM90 = ("arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,"
            "SplitKV,CtasPerSM,RowsPerMMA,Schedule,num_stages,num_warps,variant,us,provenance\n"
            "sm_90,132,32,128,64,0,8,1,any,gluon,64,,0,0,1,split,4,4,wgmma,3.0,p\n"
            "sm_90,132,32,128,64,0,64,1,any,gluon,128,,0,0,1,split,3,4,wgmma,9.0,p\n")


def test_sm_90_tables_drop_the_knobs_that_never_vary_and_read_old_files_alike(tmp_path):
    """``WavePerEU`` (empty in every sm_90 row) and ``num_warps`` (4 in every sm_90 gluon row) are
    no columns of a table the writer writes for sm_90; a file with them (the old format) and one
    without read as the same rows."""
    old = tmp_path / "old_tuned.csv"
    old.write_text(OLD_SM90)
    rows = table.parse_file(str(old))
    assert [r.knobs["num_warps"] for r in rows] == [4, 4]
    new = str(tmp_path / "new_tuned.csv")
    table.TableWriter.for_rows(rows).write(new, rows)
    header = open(new).read().splitlines()[0].split(",")
    assert "num_warps" not in header and "WavePerEU" not in header and "ChunkK" in header
    assert [(r.key, r.backend, r.knobs, r.us) for r in table.parse_file(new)] == \
        [(r.key, r.backend, r.knobs, r.us) for r in rows]


def test_a_fixed_knob_keeps_its_column_where_a_row_differs_or_leaves_it_unset(tmp_path):
    old = tmp_path / "old_tuned.csv"
    old.write_text(OLD_SM90.replace("split,3,4,wgmma", "split,3,,wgmma"))
    rows = table.parse_file(str(old))
    assert "num_warps" not in rows[1].knobs  # the column is there: an empty cell stays unset
    new = str(tmp_path / "new_tuned.csv")
    table.TableWriter.for_rows(rows).write(new, rows)
    assert "num_warps" in open(new).read().splitlines()[0].split(",")
    assert [r.knobs for r in table.parse_file(new)] == [r.knobs for r in rows]


def test_the_shipped_tables_parse_with_the_same_knobs_as_before_the_columns_left():
    """The shipped sm_90 table has no ``WavePerEU`` column and a ``num_warps`` one only where a row
    other than gluon's needs it (the top-k kernels' warps vary); its gluon rows read 4 warps."""
    path = os.path.join(table.shipped_config_dir(), "sm_90_tuned.csv")
    header = next(line for line in open(path) if not line.startswith("#")).strip().split(",")
    rows = table.parse_file(path)
    assert "WavePerEU" not in header
    assert "num_warps" not in header or any(r.backend != "gluon" and "num_warps" in r.knobs for r in rows)
    assert {r.knobs.get("num_warps") for r in rows if r.backend == "gluon"} == {4}
