"""First calls racing on several threads: every thread gets the decision of the fully loaded
table, and the dispatch cache holds that decision, never the untuned default."""

import threading
import time

from op_cases import positional
from paged_mqa_logits import dispatch, op, reload_tuned_table, table
from paged_mqa_logits.reference import make_inputs

HEADER = ("arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,"
          "SplitKV,us,provenance\n")
THREADS = 8


class SlowRows(dict):
    """Merged rows whose iteration is slow: widens the window between a table being built and
    its lookup index being complete."""

    def values(self):
        time.sleep(0.2)
        return super().values()


def test_racing_first_calls_all_see_the_tuned_row(tmp_path, monkeypatch):
    path = tmp_path / "race_tuned.csv"
    path.write_text(HEADER + "cpu,0,32,128,16,0,2,2,any,triton,32,,,1,p\n")
    monkeypatch.setenv(table.ENV_CONFIGS, str(path))
    table.parse_file(str(path))  # backends imported: loading is then quick, indexing slow
    merge = table.merge
    monkeypatch.setattr(table, "merge", lambda files: SlowRows(merge(files)))
    reload_tuned_table()
    problem = op.build_launch_args(*positional(make_inputs(2, 2, 32, [40, 17], kv_block_size=16))).problem
    barrier = threading.Barrier(THREADS)
    choices = [None] * THREADS

    def first_call(i):
        barrier.wait()
        time.sleep(0.03 * i)  # staggered: later threads arrive while the first one is loading
        choices[i] = dispatch.choose(problem)

    threads = [threading.Thread(target=first_call, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(c is not None and c.backend == "triton" and c.config == {"ChunkK": 32} for c in choices), \
        [c and c.describe() for c in choices]
    assert dispatch.choose(problem).source == f"{path}:2"


def test_a_decision_racing_a_reload_is_not_cached(tmp_path, monkeypatch):
    """A decision begun before reload_tuned_table() (from the old table) is returned but not
    cached, so the next call decides from the new table."""
    problem = op.build_launch_args(*positional(make_inputs(2, 2, 32, [40, 17], kv_block_size=16))).problem
    decide = dispatch.DEFAULT.decide

    def decide_then_reload(p, target=None):
        choice = decide(p, target)
        path = tmp_path / "new_tuned.csv"
        path.write_text(HEADER + "cpu,0,32,128,16,0,2,2,any,triton,32,,,1,p\n")
        monkeypatch.setenv(table.ENV_CONFIGS, str(path))
        reload_tuned_table()  # another thread reloads while this decision is in flight
        return choice

    monkeypatch.setattr(dispatch.DEFAULT, "decide", decide_then_reload)
    assert dispatch.choose(problem).backend == "torch"  # the old (shipped) table's default
    monkeypatch.setattr(dispatch.DEFAULT, "decide", decide)
    assert dispatch.choose(problem).backend == "triton"
