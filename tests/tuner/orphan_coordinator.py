"""A tuner coordinator for test_tuner_safety: starts one real worker, gives it a candidate that
hangs, prints the worker's pid once the candidate is running, then waits to be killed."""

import multiprocessing
import sys
import time

from paged_mqa_logits import bench
from tuner.worker import Task, _Worker

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    worker = _Worker(ctx, 0, "cpu", {"PAGED_MQA_LOGITS_EXTRA_BACKENDS": "fake_backends:BACKEND"})
    assert worker.conn.recv()[0] == "hello"
    shape = bench.Shape.of(heads=16, next_n=1, batch=1, context=32, kv_block_size=16)
    task = Task(id=0, shape=shape, impls=[bench.Impl.of("fake", {"mode": "hang"})], workload={"copies": 1})
    worker.conn.send(task.message())
    while True:
        kind, _, payload = worker.conn.recv()
        if kind == "start":
            break
    print(worker.proc.pid, flush=True)
    sys.stdout.close()
    while True:
        time.sleep(1)
