"""Tuned-table files for tests: one written from rows, and put in effect for the op."""

import os

from paged_mqa_logits import reload_tuned_table

HEADER = "arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,SplitKV,num_warps,us,provenance\n"


def write(tmp_path, name, rows, header=HEADER):
    path = tmp_path / name
    path.write_text(header + "".join(r + "\n" for r in rows))
    return str(path)


def use(monkeypatch, *paths):
    """The table files in effect are ``paths`` (the env var), re-read now."""
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", os.pathsep.join(paths))
    reload_tuned_table()
