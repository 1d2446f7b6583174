"""A dispatched backend whose launch raises falls back down the chain (one warning, the failed
choice remembered); a forced backend raises; graph capture propagates the error."""

import dataclasses
import logging

import pytest
import torch

from op_cases import positional
from paged_mqa_logits.backends import registry
from paged_mqa_logits import backends, dispatch, op, paged_mqa_logits, reload_tuned_table, table
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits

HEADER = ("arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,"
          "SplitKV,us,provenance\n")


class RaisingBackend:
    """Serves every problem; its launch fails like a compiler or driver error would."""

    name = "raising"
    knobs = ("ChunkK",)

    def __init__(self):
        self.launches = 0

    def unsupported(self, problem):
        return None

    def candidates(self, problem):
        return [{}]

    def default_config(self, problem):
        return {}

    def check_config(self, config, problem=None):
        return None

    def launch(self, args, config):
        self.launches += 1
        raise RuntimeError("PTX assembly aborted\nsecond line of the log")


@pytest.fixture
def raising(monkeypatch):
    backend = RaisingBackend()
    backends.register("raising", backend)
    monkeypatch.setattr(dispatch.DEFAULT, "fallback_chain", lambda arch: ("raising", "torch"))
    reload_tuned_table()
    yield backend
    registry._REGISTRY.pop("raising", None)
    registry._LOADED.pop("raising", None)
    reload_tuned_table()


def inputs():
    return make_inputs(2, 2, 32, [40, 17], kv_block_size=16, max_model_len=48)


def test_failed_launch_falls_back_once_with_one_warning(raising, caplog):
    inp = inputs()
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"], 48,
                           kv_block_size=16)
    with caplog.at_level(logging.WARNING, logger="paged_mqa_logits"):
        for _ in range(3):
            before = inp["out_logits"].clone()
            paged_mqa_logits(*positional(inp))
            assert check_logits(inp["out_logits"], before, ref).ok
    assert raising.launches == 1  # remembered: not retried on every call
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert "raising [defaults] failed for arch=cpu" in warnings[0].getMessage()
    assert "RuntimeError: PTX assembly aborted; falling back" in warnings[0].getMessage()
    args = op.build_launch_args(*positional(inp))
    assert dispatch.choose(args.problem, args.target).backend == "torch"
    assert any(key[:3] == (args.problem, args.target, "raising") for key in dispatch.failures())


def test_a_table_row_whose_launch_fails_falls_back_too(tmp_path, monkeypatch):
    triton_backend = backends.get("triton")

    def failing_launch(args, config):
        raise RuntimeError("PTX assembly aborted")

    monkeypatch.setattr(triton_backend, "launch", failing_launch)
    path = tmp_path / "r_tuned.csv"
    path.write_text(HEADER + "cpu,0,32,128,16,0,2,2,any,triton,64,,,1,p\n")
    monkeypatch.setenv(table.ENV_CONFIGS, str(path))
    reload_tuned_table()
    inp = inputs()
    before = inp["out_logits"].clone()
    paged_mqa_logits(*positional(inp))
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"], 48,
                           kv_block_size=16)
    assert check_logits(inp["out_logits"], before, ref).ok
    args = op.build_launch_args(*positional(inp))
    problem = args.problem
    assert (problem, args.target, "triton", dispatch.knobs_key({"ChunkK": 64})) in dispatch.failures()
    choice = dispatch.choose(problem)
    assert choice.backend == "torch" and "launch failed (RuntimeError: PTX assembly aborted)" in choice.describe()


def test_forced_backend_still_raises(raising):
    with pytest.raises(RuntimeError, match="PTX assembly aborted"):
        paged_mqa_logits(*positional(inputs()), backend="raising")
    assert not dispatch.failures()


def test_every_choice_failing_raises_with_the_reasons(raising, monkeypatch):
    monkeypatch.setattr(dispatch.DEFAULT, "fallback_chain", lambda arch: ("raising",))
    with pytest.raises(RuntimeError, match=r"no backend can serve .*raising: launch failed \(RuntimeError") as err:
        paged_mqa_logits(*positional(inputs()))
    assert "PTX assembly aborted" in str(err.value.__cause__)


def test_out_of_memory_is_raised_not_remembered(raising, monkeypatch):
    def out_of_memory(args, config):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(raising, "launch", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        paged_mqa_logits(*positional(inputs()))
    assert not dispatch.failures()


def test_no_fallback_during_graph_capture(raising, monkeypatch):
    monkeypatch.setattr(dispatch, "capturing", lambda target: True)
    with pytest.raises(RuntimeError, match="PTX assembly aborted"):
        paged_mqa_logits(*positional(inputs()))
    assert not dispatch.failures()


def test_capture_is_detected_only_on_cuda_devices(monkeypatch):
    args = op.build_launch_args(*positional(inputs()))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not dispatch.capturing(args.target)  # CPU tensors are never captured
    assert dispatch.capturing(dataclasses.replace(args.target, device_type="cuda"))  # the tensors' device decides


class Clock:
    """A dispatcher clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("error,retried", [(OSError(28, "No space left on device"), True),
                                           (TimeoutError("ptxas timed out"), True),
                                           (RuntimeError("PTX assembly aborted"), False)])
def test_a_transient_failure_is_tried_again_after_a_pause(raising, monkeypatch, error, retried):
    """A launch that failed for a reason outside the choice (the OS, a timeout) falls back, and
    the choice is tried again after a pause that doubles while it keeps failing; other failures
    stay remembered for the life of the process."""
    clock = Clock()
    monkeypatch.setattr(dispatch.DEFAULT, "clock", clock)

    def fail(args, config):
        raising.launches += 1
        raise error

    monkeypatch.setattr(raising, "launch", fail)
    inp = inputs()
    paged_mqa_logits(*positional(inp))
    paged_mqa_logits(*positional(inp))
    assert raising.launches == 1
    clock.now += dispatch.RETRY_PAUSE_S
    paged_mqa_logits(*positional(inp))
    assert raising.launches == (2 if retried else 1)
    clock.now += dispatch.RETRY_PAUSE_S  # the pause doubled: not yet
    paged_mqa_logits(*positional(inp))
    assert raising.launches == (2 if retried else 1)
    clock.now += dispatch.RETRY_PAUSE_S
    monkeypatch.setattr(dispatch, "capturing", lambda target: True)  # a graph capture keeps its choice
    paged_mqa_logits(*positional(inp))
    assert raising.launches == (2 if retried else 1)
    monkeypatch.setattr(dispatch, "capturing", lambda target: False)
    paged_mqa_logits(*positional(inp))
    assert raising.launches == (3 if retried else 1)
