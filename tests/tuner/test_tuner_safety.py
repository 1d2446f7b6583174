"""Tuners sharing an output table never lose rows (an flock around read-merge-write), and
workers never outlive their coordinator, even while a candidate hangs."""

import os
import signal
import subprocess
import sys
import time

from paged_mqa_logits import table
from paged_mqa_logits.problem import ShapeKey
from paged_mqa_logits.table import Row
from tuner.writer import update_table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ROWS_PER_WRITER = 60

WRITER = """
import sys
from paged_mqa_logits.problem import ShapeKey
from paged_mqa_logits.table import Row
from tuner.writer import update_table
path, context = sys.argv[1], int(sys.argv[2])
for batch in range(1, {n} + 1):
    key = ShapeKey(heads=16, head_dim=128, kv_block_size=16, preshuffle=False, batch=batch, next_n=1)
    row = Row("cpu", 0, key, context, "torch", (), 1.0, "tuned:test", "")
    update_table(path, [row])
""".format(n=ROWS_PER_WRITER)


def env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))


def test_two_tuners_writing_one_table_keep_every_row(tmp_path):
    path = str(tmp_path / "cpu_tuned.csv")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, path, str(context)], env=env()) for context in (64, 128)]
    assert [w.wait(300) for w in writers] == [0, 0]
    rows = table.parse_file(path)
    assert len(rows) == 2 * ROWS_PER_WRITER
    assert ({(r.shape_key.batch, r.context) for r in rows}
            == {(b, c) for b in range(1, ROWS_PER_WRITER + 1) for c in (64, 128)})
    assert sorted(os.listdir(tmp_path)) == ["cpu_tuned.csv"]  # no temporary file, no lock file left


def test_three_tuners_writing_one_table_keep_every_row(tmp_path):
    """The lock file is removed by each holder: waiters that got the lock of a removed file
    must take it again, or two writers would merge at once and lose rows."""
    path = str(tmp_path / "cpu_tuned.csv")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, path, str(context)], env=env())
               for context in (64, 128, 256)]
    assert [w.wait(300) for w in writers] == [0, 0, 0]
    assert len(table.parse_file(path)) == 3 * ROWS_PER_WRITER
    assert os.listdir(tmp_path) == ["cpu_tuned.csv"]


def test_a_symlinked_table_is_written_through_to_its_target(tmp_path):
    """``-o`` naming a symbolic link: the link stays, its target gets the rows (atomically), and
    the lock is taken on the target (tuners writing through the link and to the file share it)."""
    target = tmp_path / "real" / "sm_90_tuned.csv"
    target.parent.mkdir()
    link = tmp_path / "my_tuned.csv"
    link.symlink_to(target)
    key = ShapeKey(heads=16, head_dim=128, kv_block_size=16, preshuffle=False, batch=1, next_n=1)
    update_table(str(link), [Row("cpu", 0, key, None, "torch", (), 2.0, "tuned:a", "")])
    other = ShapeKey(heads=16, head_dim=128, kv_block_size=16, preshuffle=False, batch=2, next_n=1)
    update_table(str(target), [Row("cpu", 0, other, None, "torch", (), 2.0, "tuned:b", "")])
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert {r.shape_key.batch for r in table.parse_file(str(link))} == {1, 2}
    assert sorted(os.listdir(tmp_path)) == ["my_tuned.csv", "real"] and os.listdir(target.parent) == [target.name]


def test_update_table_merges_under_the_lock(tmp_path):
    path = str(tmp_path / "t_tuned.csv")
    key1, key2 = (ShapeKey(heads=16, head_dim=128, kv_block_size=16, preshuffle=False, batch=b, next_n=1) for b in (1, 2))
    old = Row("cpu", 0, key1, None, "torch", (), 2.0, "tuned:old", "")
    update_table(path, [old])
    new = Row("cpu", 0, key2, None, "triton", (("ChunkK", 32),), 1.0, "tuned:new", "")
    written = update_table(path, [new])
    assert {r.shape_key.batch for r in written} == {1, 2} == {r.shape_key.batch for r in table.parse_file(path)}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")  # a zombie has exited
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.1)
    return False


def _kill_parent_expect_child_gone(parent, message: str) -> None:
    """``parent`` prints the pid of a child that is running (a hanging candidate, an armed
    watchdog); SIGKILL the parent, then the child must be gone within 5 s."""
    try:
        child_pid = int(parent.stdout.readline())
        assert not _gone(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        assert _wait_gone(child_pid, 5), message
    finally:
        if parent.poll() is None:
            parent.kill()


def test_worker_dies_with_its_coordinator_while_a_candidate_hangs():
    coordinator = subprocess.Popen([sys.executable, os.path.join(HERE, "orphan_coordinator.py")], env=env(),
                                   stdout=subprocess.PIPE, text=True)
    _kill_parent_expect_child_gone(coordinator, "the worker outlived its coordinator")


ORPHAN = """
import os, subprocess, sys, time
if sys.argv[1] == "middle":
    leaf = subprocess.Popen([sys.executable, "-c", sys.argv[2], "leaf", sys.argv[2]], stdout=subprocess.PIPE, text=True)
    assert leaf.stdout.readline().strip() == "armed"
    print(leaf.pid, flush=True)
    time.sleep(600)
else:
    sys.platform = "elsewhere"  # no prctl: the watchdog alone
    from tuner.worker import die_with_parent
    die_with_parent(os.getppid())
    print("armed", flush=True)
    time.sleep(600)
"""


def test_the_watchdog_alone_ends_an_orphan():
    middle = subprocess.Popen([sys.executable, "-c", ORPHAN, "middle", ORPHAN], env=env(), stdout=subprocess.PIPE,
                              text=True)
    _kill_parent_expect_child_gone(middle, "the orphan's watchdog did not end it")


def test_a_re_tune_keeps_the_tables_notes_and_replaces_its_own_lines(tmp_path):
    """Notes that explain hand-picked rows outlive a tuner run over other keys; the tuner's own
    header line (same text up to its first parenthesis) is replaced by the new one."""
    path = tmp_path / "t_tuned.csv"
    key1, key2 = (ShapeKey(heads=16, head_dim=128, kv_block_size=16, preshuffle=False, batch=b, next_n=1) for b in (1, 2))
    update_table(str(path), [Row("cpu", 0, key1, None, "torch", (), 2.0, "bench:x", "")],
                 comments=["rows written by the tuner (run 1)"])
    path.write_text(path.read_text().replace("\narch,", "\n# the bench:x row was picked by hand\narch,", 1))
    update_table(str(path), [Row("cpu", 0, key2, None, "torch", (), 1.0, "tuned:b", "")],
                 comments=["rows written by the tuner (run 2)"])
    notes = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert notes == ["# rows written by the tuner (run 2)", "# the bench:x row was picked by hand"]
    assert {r.shape_key.batch for r in table.parse_file(str(path))} == {1, 2}
