"""``paged_mqa_logits.explain`` applies the op's argument rules to a described problem, and
knows the archs of the arch table and of the loaded tuned tables."""

import pytest

from paged_mqa_logits import PagedMQAArgumentError, explain, reload_tuned_table
from paged_mqa_logits.table import REQUIRED_COLUMNS

BASE = dict(arch="gfx950", cu_num=256, batch=4, next_n=1, heads=32)


@pytest.mark.parametrize("change,keyword", [
    (dict(next_n=9), "next_n"), (dict(heads=17), "heads"), (dict(head_dim=64), "head_dim"),
    (dict(kv_block_size=48), "kv_block_size"), (dict(kv_block_size=1, preshuffle=True), "kv_block_size"),
    (dict(batch=0), "batch"), (dict(arch="gfx1"), "arch"), (dict(cu_num=0), "cu_num"), (dict(context=-2), "context"),
])
def test_rule_violations_name_the_keyword(change, keyword):
    with pytest.raises(PagedMQAArgumentError, match=f"paged_mqa_logits.explain: argument `{keyword}`: expected"):
        explain(**dict(BASE, **change))


def test_an_arch_named_by_a_loaded_table_is_known(tmp_path, monkeypatch):
    table = tmp_path / "mine_tuned.csv"
    table.write_text(",".join(REQUIRED_COLUMNS) + "\nsm_80,108,32,128,64,0,64,1,any,triton,128,0,1,p\n")
    with pytest.raises(PagedMQAArgumentError, match="`arch`"):
        explain(**dict(BASE, arch="sm80", cu_num=108, batch=64))
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", str(table))
    reload_tuned_table()
    choice = explain(**dict(BASE, arch="sm80", cu_num=108, batch=64))
    assert choice.backend == "triton" and choice.config.get("ChunkK") == 128


def test_explain_topk_default_and_tuned_row(tmp_path, monkeypatch, capsys):
    """``explain --topk`` prints the top-k pick, its knobs and the rule; a tuned row wins."""
    from paged_mqa_logits.__main__ import main

    assert main(["explain", "--topk", "--arch", "gfx950", "--batch", "128", "--next-n", "2", "--context", "65536"]) == 0
    out = capsys.readouterr().out
    assert "rows=256 (batch 128 x next_n 2) context=65536 k=2048" in out
    assert "backend : triton_sample\n" in out and "knobs   : BLOCK=8192, num_warps=8" in out
    assert "default for gfx950" in out
    tuned = tmp_path / "gfx950_topk_tuned.csv"
    tuned.write_text("arch,cu_num,op,rows,k,context,backend,BLOCK,num_warps,split,us,provenance\n"
                     "gfx950,256,topk,256,2048,65536,triton_radix,2048,16,2,5.0,tuned:test\n")
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", f"default{__import__('os').pathsep}{tuned}")
    reload_tuned_table()
    try:
        assert main(["explain", "--topk", "--arch", "gfx950", "--batch", "256", "--context", "65536"]) == 0
        out = capsys.readouterr().out
        assert "backend : triton_radix" in out and "BLOCK=2048, num_warps=16, split=2" in out
        assert "rule    : exact row" in out and f"source  : {tuned}:2" in out
    finally:
        monkeypatch.delenv("PAGED_MQA_LOGITS_CONFIGS")
        reload_tuned_table()


@pytest.mark.parametrize("args,message", [
    (["--k", "0"], "argument --k: expected an int in 1..4096, got 0"),
    (["--context", "0"], "argument --context: expected an int >= 1 (the row width), got 0"),
    (["--batch", "0"], "argument --batch: expected an int >= 1, got 0"),
    (["--arch", "gfx9"], "argument --arch: expected one of"),
])
def test_explain_topk_errors_name_the_option(args, message, capsys):
    from paged_mqa_logits.__main__ import main

    base = {"--arch": "sm_90"}
    argv = ["explain", "--topk"] + [w for kv in {**base, **dict(zip(args[::2], args[1::2]))}.items() for w in kv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_explain_topk_function_names_the_keyword():
    from paged_mqa_logits.explain import explain_topk

    with pytest.raises(PagedMQAArgumentError, match="argument `k`: expected an int in 1..4096, got 9999"):
        explain_topk(arch="sm_90", cu_num=132, batch=1, context=8192, k=9999)
    assert explain_topk(arch="cpu", cu_num=0, batch=2, context=64, k=8).backend == "torch"
