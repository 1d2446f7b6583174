"""Host overhead of one cached dispatch (a benchmark, not a timed test).

Prints microseconds per call of:

* ``dispatch.choose(problem)``, warm (the per-key decision is cached);
* ``build_launch_args(...)``: validation and the problem key, from tensor metadata only;
* ``paged_mqa_logits(..., backend="noop")``: the whole call with a backend whose launch does
  nothing, i.e. everything the op adds around a kernel launch;
* ``launch(args)`` and ``paged_mqa_logits(...)`` through the production dispatch with the real
  backend on the current device (GPU: asynchronous launches, synchronised once at the end, so
  the figure is the host cost per call whenever the kernel is shorter than that).

``python tools/host_overhead.py [--iters N] [--device cpu|cuda] [--batch B ...]``; with
``$OUT`` set, the table is also written to ``$OUT/host_overhead.csv``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from paged_mqa_logits import dispatch, paged_mqa_logits  # noqa: E402
from paged_mqa_logits.op import build_launch_args, launch  # noqa: E402
from paged_mqa_logits.reference import make_inputs  # noqa: E402


class NoopBackend:
    """Serves everything, launches nothing: isolates the op's own host work."""

    name = "noop"
    knobs: tuple = ()

    def unsupported(self, problem):
        return None

    def candidates(self, problem):
        return [{}]

    def default_config(self, problem):
        return {}

    def launch(self, args, config):
        pass


def per_call_us(fn, iters: int, repeats: int = 5, sync=lambda: None) -> float:
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> list[tuple[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--next-n", type=int, default=1)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--kv-block-size", type=int, default=64)
    a = p.parse_args(argv)

    from tuner.candidates import register_backend

    register_backend(NoopBackend())
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    inp = make_inputs(a.batch, a.next_n, a.heads, a.context, kv_block_size=a.kv_block_size, device=device)
    call = (inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["out_logits"], inp["context_lens"], inp["kv_indices"],
            inp["max_model_len"], False, a.kv_block_size)
    args = build_launch_args(*call, context_hint=a.context)
    choice = dispatch.choose(args.problem)
    rows = [
        ("dispatch.choose(problem), warm", per_call_us(lambda: dispatch.choose(args.problem), a.iters, a.repeats)),
        ("build_launch_args (validation + key)", per_call_us(lambda: build_launch_args(*call, context_hint=a.context),
                                                             a.iters, a.repeats)),
        ("paged_mqa_logits(..., backend='noop')", per_call_us(lambda: paged_mqa_logits(*call, context_hint=a.context,
                                                                                        backend="noop"),
                                                              a.iters, a.repeats)),
        (f"launch(args), real backend {choice.backend}", per_call_us(lambda: launch(args), a.iters, a.repeats, sync)),
        (f"paged_mqa_logits(...), real backend {choice.backend}",
         per_call_us(lambda: paged_mqa_logits(*call, context_hint=a.context), a.iters, a.repeats, sync)),
    ]
    print(f"host overhead on {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'}), "
          f"B={a.batch} next_n={a.next_n} H={a.heads} context={a.context}; dispatch: {choice.describe()}")
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"  {name.ljust(width)}  {us:9.2f} us/call")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "host_overhead.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["what", "us_per_call", "device"])
            w.writerows([(name, f"{us:.3f}", device) for name, us in rows])
    return rows


if __name__ == "__main__":
    main()
