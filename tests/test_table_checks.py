"""Tables are checked when they load: every knob against its backend's space (through
``Backend.check_config``), unknown columns, non-finite or negative times, binary files."""

import os

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import PagedMQAArgumentError, backends, paged_mqa_logits, reload_tuned_table, table
from paged_mqa_logits.reference import make_inputs

HEADER = ("arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,"
          "SplitKV,num_stages,variant,us,provenance\n")


def write(tmp_path, rows, header=HEADER, name="bad_tuned.csv"):
    path = tmp_path / name
    path.write_text(header + "".join(r + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("row,message", [
    ("sm_90,132,64,128,64,0,8,1,any,gluon,3,,0,,wgmma,10,p", "gluon/wgmma knob ChunkK=3: expected one of 64, 128, 256"),
    ("sm_90,132,64,128,64,0,8,1,any,gluon,64.9,,0,,wgmma,10,p", "ChunkK=64.9: expected one of 64, 128, 256"),
    ("sm_90,132,64,128,64,0,8,1,any,triton,64,,0,abc,,10,p", "triton knob num_stages='abc': expected an integer in 1..8"),
    ("sm_90,132,64,128,64,0,8,1,any,triton,64,,1000000,,,10,p", "SplitKV=1000000: expected an integer in 0..1024"),
    ("gfx950,256,64,128,64,0,8,1,any,flydsl,256,,0,,,10,p", "flydsl knob ChunkK=256: expected one of 64, 128"),
    ("gfx942,304,64,128,64,0,8,1,any,gluon,128,2,0,,wgmma,10,p", "gluon/wgmma runs on sm_90, not gfx942"),
    ("sm_90,132,64,128,64,0,8,1,any,gluon,64,,0,,tiles,10,p", "gluon knob variant='tiles': expected one of"),
    ("sm_90,132,64,128,64,0,8,1,any,torch,64,,,,,10,p", "torch has no knob 'ChunkK'"),
    ("sm_90,132,64,128,64,0,8,1,any,triton,64,,0,,,nan,p", "column us must be a finite number >= 0, got 'nan'"),
    ("sm_90,132,64,128,64,0,8,1,any,triton,64,,0,,,-inf,p", "got '-inf'"),
    ("sm_90,132,64,128,64,0,8,1,any,triton,64,,0,,,-1,p", "got '-1'"),
])
def test_bad_rows_are_rejected_at_load_naming_file_line(tmp_path, row, message):
    path = write(tmp_path, ["sm_90,132,64,128,64,0,4,1,any,triton,64,,0,3,,10,p", row])
    with pytest.raises(table.TableError) as err:
        table.parse_file(path)
    assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value), str(err.value)


def test_combinations_are_judged_by_the_variant_knob_parser(tmp_path):
    """RowsPerMMA 8 x 64 heads exceeds wgmma's N of 256: only the variant's knob parser knows, for
    the row's heads; its message names the knob, what it expects and what it got."""
    header = HEADER.replace("variant", "variant,RowsPerMMA")
    ok = write(tmp_path, ["sm_90,132,32,128,64,0,8,8,any,gluon,64,,0,4,wgmma,8,10,p"], header, "ok_tuned.csv")
    assert table.parse_file(ok)[0].knobs["RowsPerMMA"] == 8
    bad = write(tmp_path, ["sm_90,132,64,128,64,0,8,8,any,gluon,64,,0,4,wgmma,8,10,p"], header)
    with pytest.raises(table.TableError, match=r":2: gluon/wgmma knob RowsPerMMA=8: expected RowsPerMMA x heads "
                                               r"<= 256 .*, got 8 x 64 heads \(allowed: ChunkK"):
        table.parse_file(bad)


def test_unknown_column_names_the_column_and_the_known_ones(tmp_path):
    path = write(tmp_path, [], header=HEADER.replace("variant", "varaint"))
    with pytest.raises(table.TableError) as err:
        table.parse_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}:1: unknown column(s) varaint (column 15); known columns: arch, ")
    assert "variant" in message and "WavePerEU" in message


def test_binary_file_is_a_table_error(tmp_path):
    path = tmp_path / "bin_tuned.csv"
    path.write_bytes(HEADER.encode() + bytes(range(128, 256)))
    with pytest.raises(table.TableError, match=f"^{path}:2: not a text"):
        table.parse_file(str(path))
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(table.TableError, match="not a text"):
        table.parse_file(str(path))
    assert issubclass(table.TableError, PagedMQAArgumentError)


@pytest.mark.parametrize("via_op", [False, True])
def test_a_bad_table_fails_calls_with_the_table_error_on_both_paths(tmp_path, monkeypatch, via_op):
    path = write(tmp_path, ["cpu,0,32,128,16,0,2,2,any,triton,3,,0,,,10,p"])
    monkeypatch.setenv(table.ENV_CONFIGS, path)
    reload_tuned_table()
    inp = make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)
    call = torch.ops.paged_mqa_logits.paged_mqa_logits if via_op else paged_mqa_logits
    with pytest.raises(table.TableError, match=f"{path}:2: triton knob ChunkK=3"):
        call(*positional(inp))
    assert not torch.isfinite(inp["out_logits"]).any()


def test_shipped_tables_pass_the_checks():
    for path in table.shipped_files():
        assert table.parse_file(path)


def test_shipped_tables_hold_each_key_once():
    """A key written twice in one file (a merge that kept both sides) is legal, the fastest row
    wins, but hides which row a reader should trust: the shipped tables hold each key once."""
    for path in table.shipped_files():
        seen = {}
        for row in table.parse_file(path):
            assert row.key not in seen, f"{row.source} repeats {seen[row.key]}"
            seen[row.key] = row.source


def test_the_tuned_sm_90_table_covers_the_keys_it_was_tuned_for():
    """Every key of the compact untuned table (what the H200 tuning covers) has its rows in the
    tuned table: an edit that drops rows (a merge, a script keyed wrongly) falls back to the
    nearest batch's pick, silently slower, without this."""
    import csv

    config_dir = table.shipped_config_dir()
    rows = table.parse_file(str(config_dir / "sm_90_tuned.csv"))
    tuned = {(r.shape_key.heads, r.shape_key.head_dim, r.shape_key.kv_block_size, r.shape_key.preshuffle,
              r.shape_key.batch, r.shape_key.next_n) for r in rows if r.op == table.DEFAULT_OP}
    with open(config_dir / "sm_90_compact_untuned.csv") as f:
        keys = [row for row in csv.DictReader(line for line in f if not line.startswith("#"))]
    assert keys
    missing = [k for k in keys if (int(k["heads"]), int(k["head_dim"]), int(k["kv_block_size"]),
                                   bool(int(k["preshuffle"])), int(k["batch"]), int(k["next_n"])) not in tuned]
    assert not missing, missing
    # the top-k rows, where the table has any: every key of the shipped top-k list, at each of its contexts
    # (none: the untuned default serves every key, as the table's header says)
    topk = {(r.shape_key.rows, r.shape_key.k, r.context) for r in rows if r.op == "topk"}
    if not topk:
        return
    with open(config_dir / "topk_untuned.csv") as f:
        topk_keys = [row for row in csv.DictReader(line for line in f if not line.startswith("#"))]
    assert topk_keys
    missing = [(k["rows"], k["k"], c) for k in topk_keys for c in k["contexts"].split(";")
               if (int(k["rows"]), int(k["k"]), int(c)) not in topk]
    assert not missing, missing


def test_every_backend_implements_check_config():
    for name in backends.names():
        backend = backends.get(name)
        assert backend.check_config({}) is None
        assert "Nonsense" in backend.check_config({"Nonsense": 1})
