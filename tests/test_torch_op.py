"""The registered torch op: schema, routing, fake implementation, torch.compile on CPU, and graph
capture/replay on a GPU (skipped without one)."""

import pytest
import torch

from paged_mqa_logits import torch_op
from paged_mqa_logits.op import PagedMQAArgumentError
from paged_mqa_logits.op import paged_mqa_logits_eager as direct
from paged_mqa_logits.reference import check_logits, make_inputs, reference_logits

ARG_NAMES = ("q_fp8", "kv_cache", "weights", "out_logits", "context_lens", "kv_indices", "max_model_len")


def _args(inp, out=None):
    args = [inp[k] for k in ARG_NAMES]
    if out is not None:
        args[3] = out
    return args


def _bits(t):
    return t.view(torch.int32)


@pytest.fixture
def inputs():
    # ragged 2-D lengths, preshuffled 16-token blocks, a zero-length sequence, NaN sentinels
    return make_inputs(3, 2, 64, [70, 0, 128], kv_block_size=16, preshuffle=True, max_model_len=160, seed=3)


def test_schema_mutates_out_logits_and_returns_nothing():
    schema = torch_op.op._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == ["out_logits"]
    assert len(schema.returns) == 0
    kwarg_only = {a.name: a for a in schema.arguments if a.kwarg_only}
    assert set(kwarg_only) == {"context_hint", "clean_logits", "backend", "config", "q_scale"}
    assert kwarg_only["context_hint"].default_value == torch_op.NO_HINT


@pytest.mark.parametrize("extra", [
    {}, {"context_hint": 128}, {"clean_logits": True}, {"backend": "torch"},
    {"backend": "triton", "config": {"ChunkK": 32, "SplitKV": 2}},
])
def test_op_equals_direct_call_bit_for_bit(inputs, extra):
    expected = direct(*_args(inputs, inputs["out_logits"].clone()), True, 16, **extra)
    via_public = torch_op.paged_mqa_logits(*_args(inputs, inputs["out_logits"].clone()), True, 16, **extra)
    out = inputs["out_logits"].clone()
    hint = extra.get("context_hint", torch_op.NO_HINT)
    torch_op.op(*_args(inputs, out), True, 16, context_hint=hint, clean_logits=extra.get("clean_logits", False),
                backend=extra.get("backend"), config=None if "config" not in extra else '{"ChunkK": 32, "SplitKV": 2}')
    assert torch.equal(_bits(out), _bits(expected))
    assert torch.equal(_bits(via_public), _bits(expected))


def test_validation_errors_keep_their_type_through_the_dispatcher(inputs):
    out = inputs["out_logits"].clone()
    with pytest.raises(PagedMQAArgumentError, match="KVBlockSize"):
        torch_op.op(*_args(inputs, out), True, 32)
    assert torch.equal(_bits(out), _bits(inputs["out_logits"]))


def test_eager_calls_take_the_direct_path_unless_something_is_watching(inputs, monkeypatch):
    calls = []
    real = torch_op.op
    monkeypatch.setattr(torch_op, "op", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    out = inputs["out_logits"].clone()
    assert torch_op.paged_mqa_logits(*_args(inputs, out), True, 16) is out
    assert calls == []  # plain eager: no dispatcher

    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    args = _args(inputs, inputs["out_logits"].clone())
    with Record():
        torch_op.paged_mqa_logits(*args, True, 16)
    assert calls == [1]
    assert seen == ["paged_mqa_logits.paged_mqa_logits.default"]  # one opaque op, not its internals

    monkeypatch.setattr(torch_op, "EAGER_VIA_OP", True)
    torch_op.paged_mqa_logits(*_args(inputs, inputs["out_logits"].clone()), True, 16)
    assert calls == [1, 1]


def test_fake_implementation_under_fake_tensor_mode(inputs):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in _args(inputs)]
        assert torch_op.paged_mqa_logits(*fake, True, 16, context_hint=100) is fake[3]


def test_make_fx_records_one_op(inputs):
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, kv, w, out, lens, table):
        torch_op.paged_mqa_logits(q, kv, w, out, lens, table, 160, True, 16)
        return out[:, :8].sum()

    graph = make_fx(step)(*_args(inputs)[:6])
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch_op.op in targets


def test_torch_compile_fullgraph_on_cpu_equals_eager(inputs):
    torch._dynamo.reset()

    def step(q, kv, w, out, lens, table, max_model_len: int, hint: int):
        torch_op.paged_mqa_logits(q, kv, w, out, lens, table, max_model_len, True, 16, context_hint=hint)
        return torch.nan_to_num(out[:, :max_model_len], nan=0.0, neginf=0.0).sum(dim=1)

    compiled = torch.compile(step, fullgraph=True)
    for hint, lens in ((128, None), (96, torch.tensor([[40, 41], [0, 0], [95, 96]], dtype=torch.int32))):
        if lens is not None:
            inputs["context_lens"].copy_(lens)  # in place, as an engine updates its metadata
        eager_out = inputs["out_logits"].clone()
        eager_sum = step(*_args(inputs, eager_out)[:6], 160, hint)
        out = inputs["out_logits"].clone()
        got_sum = compiled(*_args(inputs, out)[:6], 160, hint)
        assert torch.equal(_bits(out), _bits(eager_out))  # written in place into the caller's buffer
        torch.testing.assert_close(got_sum, eager_sum)  # inductor may reorder the reduction
    ref = reference_logits(*[inputs[k] for k in ("q_fp8", "kv_cache", "weights", "context_lens", "kv_indices")],
                           160, kv_block_size=16, preshuffle=True)
    assert check_logits(out, inputs["out_logits"], ref).ok
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- GPU
def _gpu_inputs(**kw):
    if not torch.cuda.is_available():
        pytest.skip("graph capture needs a CUDA/ROCm GPU; none present (CPU-only machine)")
    from paged_mqa_logits.arch import detect

    fp8 = torch.float8_e4m3fnuz if detect("cuda").arch == "gfx942" else torch.float8_e4m3fn
    return make_inputs(device="cuda", fp8_dtype=fp8, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("preshuffle,kv_block_size,next_n", [(False, 64, 1), (True, 64, 2), (False, 64, 4)])
def test_graph_capture_replay_equals_eager_and_follows_lengths_changed_in_place(preshuffle, kv_block_size, next_n):
    full = [3000, 1, 700, 4096]
    inp = _gpu_inputs(batch=4, next_n=next_n, heads=64, context_lens=full, kv_block_size=kv_block_size,
                      preshuffle=preshuffle, max_model_len=4096, seed=11)
    lens = inp["context_lens"]
    full_lens = lens.clone()
    lens.copy_((full_lens - 200).clamp_min(0))  # start shorter: blocks for every later length exist
    args = _args(inp)
    static_out = torch.full_like(inp["out_logits"], float("nan"))
    args[3] = static_out

    def call():
        torch_op.paged_mqa_logits(*args, preshuffle, kv_block_size, context_hint=4096)

    call()  # eager warm-up on the capture stream's device: compiles outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    # every length stays within its sequence's allocated blocks (entries past them are -1)
    shrink = torch.tensor([0, 1, 650, 17], dtype=torch.int32, device="cuda")
    for new_lens in (lens.clone(), full_lens, (full_lens - shrink[:, None]).clamp_min(0).to(torch.int32)):
        lens.copy_(new_lens)
        static_out.fill_(float("nan"))
        graph.replay()
        eager = torch.full_like(static_out, float("nan"))
        eager_args = list(args)
        eager_args[3] = eager
        torch_op.paged_mqa_logits(*eager_args, preshuffle, kv_block_size, context_hint=4096)
        torch.cuda.synchronize()
        assert torch.equal(_bits(static_out), _bits(eager)), f"replay differs from eager for lengths {new_lens.tolist()}"
        ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], lens, inp["kv_indices"], 4096,
                               kv_block_size=kv_block_size, preshuffle=preshuffle)
        before = torch.full_like(static_out, float("nan"))
        assert check_logits(static_out, before, ref).ok


@pytest.mark.gpu
def test_torch_compile_fullgraph_on_gpu_equals_eager():
    inp = _gpu_inputs(batch=2, next_n=2, heads=64, context_lens=[900, 64], kv_block_size=64, preshuffle=True,
                      max_model_len=1024, seed=5)
    torch._dynamo.reset()

    def step(q, kv, w, out, lens, table):
        torch_op.paged_mqa_logits(q, kv, w, out, lens, table, 1024, True, 64)
        return out

    eager = step(*_args(inp, inp["out_logits"].clone())[:6]).clone()
    got = torch.compile(step, fullgraph=True)(*_args(inp, inp["out_logits"].clone())[:6])
    torch.cuda.synchronize()
    assert torch.equal(_bits(got), _bits(eager))
    torch._dynamo.reset()


@pytest.mark.parametrize("config", ["{not json", "[1, 2]"])
def test_a_malformed_config_through_torch_ops_is_an_argument_error(inputs, config):
    before = inputs["out_logits"].clone()
    with pytest.raises(PagedMQAArgumentError, match="argument `config`: expected"):
        torch_op.op(*_args(inputs), False, 16, backend="torch", config=config)
    assert torch.equal(_bits(inputs["out_logits"]), _bits(before))


@pytest.mark.parametrize("value,via_op", [("false", False), ("0", False), ("", False), ("yes", True), ("1", True),
                                          ("sometimes", None)])
def test_the_eager_via_op_flag_follows_the_boolean_rule(value, via_op):
    import os
    import subprocess
    import sys

    probe = "from paged_mqa_logits import torch_op; print(torch_op.EAGER_VIA_OP)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PAGED_MQA_LOGITS_EAGER_VIA_OP=value))
    if via_op is None:
        assert "PAGED_MQA_LOGITS_EAGER_VIA_OP: expected 0 or 1, got 'sometimes'" in done.stderr, done.stderr
    else:
        assert done.stdout.strip() == str(via_op), done.stderr
