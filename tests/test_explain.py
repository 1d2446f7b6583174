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
