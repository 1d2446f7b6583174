"""Dispatch: the table's row or the fallback chain, the decision cache, remembered launch
failures, logging, reloading, and the Dispatcher object (injected backends and tables)."""

import os
import subprocess
import sys

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import backends, dispatch, paged_mqa_logits, reload_tuned_table, table
from paged_mqa_logits.backends.flydsl.toolchain import NOT_INSTALLED
from paged_mqa_logits.dispatch import Dispatcher
from paged_mqa_logits.errors import PagedMQAEnvironmentError
from paged_mqa_logits.explain import explain
from paged_mqa_logits.problem import Problem, ShapeKey, Target
from paged_mqa_logits.reference import make_inputs
from paged_mqa_logits.validate import build_launch_args
from table_files import use, write


# ----------------------------------------------------------------------------- the default dispatcher
def test_dispatch_uses_row_on_cpu_and_falls_back(tmp_path, monkeypatch):
    path = write(tmp_path, "cpu_tuned.csv", [
        "cpu,0,32,128,16,0,2,1,any,triton,32,,1,4,1,p",
        "cpu,0,32,128,16,0,2,2,any,gluon,64,2,0,,1,p",
    ])
    use(monkeypatch, path)
    inp = make_inputs(2, 1, 32, [20, 9], kv_block_size=16)
    choice = dispatch.choose(build_launch_args(*positional(inp)).problem)
    assert choice.backend == "triton" and choice.config == {"ChunkK": 32, "SplitKV": 1, "num_warps": 4}
    inp2 = make_inputs(2, 2, 32, [20, 9], kv_block_size=16)
    p2 = build_launch_args(*positional(inp2)).problem
    choice2 = dispatch.choose(p2)
    assert choice2.backend == "torch" and choice2.skipped[0][0] == "gluon"
    assert "fallback: table row" in choice2.rule and f"{path}:3" in choice2.rule
    # the fallback gives the same result as the reference path
    paged_mqa_logits(*positional(inp2))
    ref = inp2["out_logits"].clone()
    inp2["out_logits"].fill_(float("nan"))
    paged_mqa_logits(*positional(inp2), backend="torch")
    assert torch.equal(ref.view(torch.int32), inp2["out_logits"].view(torch.int32))


@pytest.fixture
def picks(caplog, monkeypatch):
    """The records of the pick logger (it does not propagate: caplog's handler is attached to it)."""
    monkeypatch.setattr(dispatch.pick_logger, "handlers", [caplog.handler])
    return lambda: [r.getMessage() for r in caplog.records if r.name == "paged_mqa_logits.tuned_config"]


def test_log_once_per_new_key(monkeypatch, picks):
    monkeypatch.setenv("AITER_LOG_TUNED_CONFIG", "1")
    inp = make_inputs(1, 1, 32, [20], kv_block_size=16)
    for _ in range(3):
        paged_mqa_logits(*positional(inp))
    inp2 = make_inputs(2, 1, 32, [20, 4], kv_block_size=16)
    paged_mqa_logits(*positional(inp2))
    lines = picks()
    assert len(lines) == 2
    assert "batch=1" in lines[0] and "backend=torch" in lines[0] and "rule: default for cpu" in lines[0]
    assert "from defaults" in lines[0]


@pytest.mark.parametrize("value", [None, "0", "false", "off", "FALSE"])
def test_no_log_without_env_or_when_off(monkeypatch, picks, value):
    if value is not None:
        monkeypatch.setenv("PAGED_MQA_LOGITS_LOG_TUNED_CONFIG", value)
    inp = make_inputs(1, 1, 32, [20], kv_block_size=16)
    paged_mqa_logits(*positional(inp))
    assert not picks()


def test_a_garbage_log_flag_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("AITER_LOG_TUNED_CONFIG", "maybe")
    inp = make_inputs(1, 1, 32, [20], kv_block_size=16)
    with pytest.raises(PagedMQAEnvironmentError, match="AITER_LOG_TUNED_CONFIG: expected 0 or 1, got 'maybe'"):
        paged_mqa_logits(*positional(inp))


def test_the_pick_shows_under_an_application_logging_at_warning():
    """An application that configured logging at WARNING still sees the picks it asked for."""
    probe = ("import logging; logging.basicConfig(level=logging.WARNING)\n"
             "from op_cases import positional\n"
             "from paged_mqa_logits import paged_mqa_logits\n"
             "from paged_mqa_logits.reference import make_inputs\n"
             "paged_mqa_logits(*positional(make_inputs(1, 1, 32, [20], kv_block_size=16)))\n")
    env = dict(os.environ, AITER_LOG_TUNED_CONFIG="true", PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    picks = [line for line in done.stderr.splitlines() if line.startswith("[paged_mqa_logits] ")]
    assert len(picks) == 1 and "backend=torch" in picks[0], done.stderr


def test_reload_picks_up_changed_file(tmp_path, monkeypatch):
    path = write(tmp_path, "r_tuned.csv", ["sm_80,108,32,128,64,1,64,1,any,triton,128,,0,4,1,p"])
    use(monkeypatch, path)

    def chunk():
        return explain(arch="sm80", cu_num=108, batch=64, next_n=1, heads=32, preshuffle=True).config.get("ChunkK")

    assert chunk() == 128
    write(tmp_path, "r_tuned.csv", ["sm_80,108,32,128,64,1,64,1,any,triton,32,,0,4,1,p"])
    assert chunk() == 128  # tables are read once
    reload_tuned_table()
    assert chunk() == 32


def test_fallback_chains():
    assert dispatch.fallback_chain("cpu")[0] == "torch"
    assert dispatch.fallback_chain("gfx942")[-1] == "torch"
    assert dispatch.fallback_chain("sm_90") == ("gluon", "triton", "torch")
    assert dispatch.fallback_chain("sm_80") == ("triton", "torch")


def test_module_functions_forward_to_the_default_dispatcher():
    args = build_launch_args(*positional(make_inputs(2, 1, 32, [20, 9], kv_block_size=16)))
    problem = args.problem
    choice = dispatch.choose(problem)  # no target: the call's own, CPU tensors on the cpu arch
    assert dispatch.DEFAULT.choose(problem, args.target) is choice
    assert dispatch.decisions() == {(problem, args.target): choice}
    assert dispatch.fallback_chain("gfx950") == dispatch.DEFAULT.fallback_chain("gfx950")
    dispatch.record_failure(problem, choice, RuntimeError("boom"))
    assert dispatch.failures() == dispatch.DEFAULT.failures() and len(dispatch.failures()) == 1
    assert dispatch.decisions() == {}  # the failed decision is forgotten
    dispatch.reset()
    assert len(dispatch.failures()) == 1
    dispatch.forget_failures()
    assert dispatch.failures() == {}


# ----------------------------------------------------------------------------- Dispatcher objects
class FakeBackend:
    def __init__(self, name, serves=True):
        self.name, self.serves = name, serves

    def unsupported(self, problem):
        return None if self.serves else f"{self.name} does not serve this"

    def default_config(self, problem):
        return {"ChunkK": 64}


class FakeRegistry:
    """Only what a dispatcher asks of its backends: ``get`` and ``why_not``."""

    def __init__(self, *backends):
        self.by_name = {b.name: b for b in backends}

    def get(self, name):
        return self.by_name[name]

    def why_not(self, name, problem, target):
        backend = self.by_name.get(name)
        return f"{name} is not registered" if backend is None else backend.unsupported(problem)


class FakeTables:
    """A table source with at most one row, which names ``backend`` for every problem."""

    def __init__(self, backend=None):
        self.backend, self.lookups, self.resets = backend, 0, 0

    def lookup(self, problem):
        self.lookups += 1
        if self.backend is None:
            return table.Match(None, "no tuned row")
        row = table.Row(problem.arch, problem.cu_num, problem.shape_key, None, self.backend, (("ChunkK", 32),), 1.0,
                        "p", "fake.csv:2")
        return table.Match(row, "exact row")

    def reset(self):
        self.resets += 1


CHAIN = ("first", "second", "third")
KEY = ShapeKey(heads=32, head_dim=128, kv_block_size=16, preshuffle=False, batch=2, next_n=1)
PROBLEM = Problem.of(KEY, Target("nowhere", 0, "cpu"), max_model_len=64)
#: the target a decision for PROBLEM without one is made for
PRESENT = Target.present("nowhere", 0)


def dispatcher(tables=None, first_serves=False):
    backends = FakeRegistry(FakeBackend("first", serves=first_serves), FakeBackend("second"), FakeBackend("third"))
    return Dispatcher(backends, tables or FakeTables("first"), fallback_chain=lambda arch: CHAIN)


def test_injected_backends_and_tables_drive_the_fallback_chain():
    d = dispatcher()
    choice = d.choose(PROBLEM)
    assert (choice.backend, choice.config, choice.source) == ("second", {"ChunkK": 64}, "defaults")
    assert choice.rule == "fallback: table row fake.csv:2 names first, which cannot serve"
    assert choice.skipped == [("first", "first does not serve this")]
    d.record_failure(PROBLEM, choice, RuntimeError("compile error\nlog"))
    choice = d.choose(PROBLEM)
    assert choice.backend == "third"
    assert choice.skipped[1] == ("second", "launch failed (RuntimeError: compile error)")
    d.record_failure(PROBLEM, choice, RuntimeError("again"))
    with pytest.raises(RuntimeError, match="no backend can serve .*first: first does not serve this; second: launch"):
        d.choose(PROBLEM)


def test_a_row_whose_backend_serves_is_taken_as_it_is():
    choice = dispatcher(first_serves=True).choose(PROBLEM)
    assert (choice.backend, choice.config, choice.rule, choice.source) == ("first", {"ChunkK": 32}, "exact row",
                                                                          "fake.csv:2")
    choice = dispatcher(FakeTables(None), first_serves=True).choose(PROBLEM)
    assert (choice.backend, choice.rule) == ("first", "default for nowhere (no tuned row)")


def test_two_dispatchers_share_no_cache_and_no_failures():
    tables_a, tables_b = FakeTables("first"), FakeTables("first")
    a, b = dispatcher(tables_a), dispatcher(tables_b)
    choice_a = a.choose(PROBLEM)
    assert a.choose(PROBLEM) is choice_a and tables_a.lookups == 1  # cached
    assert b.decisions() == {} and tables_b.lookups == 0
    choice_b = b.choose(PROBLEM)
    assert choice_b is not choice_a and tables_b.lookups == 1
    a.record_failure(PROBLEM, choice_a, RuntimeError("boom"))
    assert a.choose(PROBLEM).backend == "third" and b.choose(PROBLEM).backend == "second"
    assert len(a.failures()) == 1 and b.failures() == {}
    a.reset()
    assert a.decisions() == {} and b.decisions() == {(PROBLEM, PRESENT): choice_b}
    assert (PROBLEM, PRESENT) not in dispatch.decisions() and not dispatch.failures()  # the default saw none of it


def test_reset_forgets_decisions_and_reload_forgets_failures_too():
    tables = FakeTables("first")
    d = dispatcher(tables)
    choice = d.choose(PROBLEM)
    d.record_failure(PROBLEM, choice, RuntimeError("boom"))
    third = d.choose(PROBLEM)
    d.reset()
    assert d.decisions() == {} and len(d.failures()) == 1 and tables.resets == 0
    assert d.choose(PROBLEM).backend == "third" and d.choose(PROBLEM) is not third  # decided again, same way
    lookups = tables.lookups
    d.reload_tuned_table()
    assert d.decisions() == {} and d.failures() == {} and tables.resets == 1
    assert d.choose(PROBLEM).backend == "second" and tables.lookups == lookups + 1


def test_decide_with_a_registry_uses_those_backends(tmp_path, monkeypatch):
    use(monkeypatch, write(tmp_path, "empty_tuned.csv", []))
    problem = build_launch_args(*positional(make_inputs(2, 1, 32, [20, 9], kv_block_size=16))).problem
    fakes = FakeRegistry(FakeBackend("torch", serves=False), FakeBackend("triton"))
    choice = dispatch.decide(problem, backends=fakes)
    assert (choice.backend, choice.config) == ("triton", {"ChunkK": 64})
    assert choice.skipped == [("torch", "torch does not serve this")]
    assert dispatch.decide(problem).backend == "torch"  # the package's registry
    assert dispatch.decisions() == {}  # decide never caches


# ----------------------------------------------------------------------------- targets
def _gpu_problem(arch, cu_num):
    key = ShapeKey(heads=64, head_dim=128, kv_block_size=64, preshuffle=True, batch=8, next_n=2)
    return Problem.of(key, Target.present(arch, cu_num), context=8192, max_model_len=8192)


@pytest.mark.parametrize("arch, cu_num", [("sm_90", 132), ("gfx942", 304), ("gfx950", 256)])
def test_a_described_target_lets_a_gpu_backend_be_chosen_on_any_machine(arch, cu_num):
    """explain, compile --only-table, the tuner's dry run: judged on arch and shapes only, so this
    machine (no GPU, maybe no flydsl) does not matter."""
    choice = Dispatcher(tables=FakeTables(None)).choose(_gpu_problem(arch, cu_num), Target.described(arch, cu_num))
    assert (choice.backend, choice.skipped) == ("gluon", [])


def test_a_cpu_target_skips_the_gpu_backends_with_why_they_cannot_launch():
    problem, cpu, described = _gpu_problem("gfx950", 256), Target("gfx950", 256, "cpu"), Target.described("gfx950", 256)
    d = Dispatcher(tables=FakeTables(None))
    choice = d.choose(problem, cpu)
    flydsl_reason = backends.get("flydsl").unavailable(cpu)
    assert flydsl_reason in (NOT_INSTALLED, "no ROCm runtime: the tensors are on cpu")
    assert choice.backend == "triton"  # the gfx chain's first link that runs on CPU tensors
    assert choice.skipped == [("gluon", "gluon kernels run on GPU tensors only, got cpu tensors"),
                              ("flydsl", flydsl_reason)]
    # the backends judged the problem alike: it is the target that differs
    assert all(backends.get(name).unsupported(problem) is None for name, _ in choice.skipped)
    # the same problem described is another key of the cache, decided on its own
    assert d.choose(problem, described).backend == "gluon"
    assert set(d.decisions()) == {(problem, cpu), (problem, described)}
    # and a launch failure on one target is not remembered for the other
    d.record_failure(problem, choice, RuntimeError("boom"), cpu)
    assert d.choose(problem, cpu).backend == "torch" and d.choose(problem, described).backend == "gluon"


def test_without_a_target_a_problem_is_decided_as_called_on_its_chip():
    problem = _gpu_problem("gfx950", 256)
    d = Dispatcher(tables=FakeTables(None))
    assert d.decide(problem) == d.decide(problem, Target.present("gfx950", 256))
    assert d.choose(problem) is d.choose(problem, Target("gfx950", 256, "cuda"))
