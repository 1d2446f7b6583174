"""One declaration of the op's arguments (``signature.OP``): the pieces derived from it, the
spelled-out signatures that must agree with it, and an added argument reaching every derived
piece without another edit."""

import inspect
import os
import re

import pytest
import torch

from paged_mqa_logits import signature, torch_op, validate
from paged_mqa_logits import op as op_mod
from paged_mqa_logits.compat import aiter, deep_gemm
from paged_mqa_logits.explain import describe_problem, explain
from paged_mqa_logits.signature import OP, Argument, OpSignature, Quantity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parameters(function) -> list:
    return list(inspect.signature(function).parameters.values())


# ----------------------------------------------------------------------------- derived pieces
def test_the_registered_schema_is_the_declarations():
    assert str(torch_op.op._schema) == f"{torch_op.NAMESPACE}::{OP.schema()}" == f"{torch_op.NAMESPACE}::{torch_op.SCHEMA}"
    for argument, declared in zip(torch_op.op._schema.arguments, OP.arguments, strict=True):
        assert argument.name == declared.name and argument.kwarg_only == declared.keyword_only
        assert (argument.alias_info is not None and argument.alias_info.is_write) == declared.mutated
        if declared.default is not signature.REQUIRED:
            assert argument.default_value == declared.schema_default


def test_the_eager_entry_takes_and_documents_the_declared_arguments():
    assert inspect.signature(op_mod.paged_mqa_logits_eager) == OP.python
    for a in OP.arguments:
        assert f"{a.name}: {a.doc}" in op_mod.paged_mqa_logits_eager.__doc__
        assert f"{a.name}: {a.doc}" in torch_op.paged_mqa_logits.__doc__


def test_explain_takes_and_documents_the_declared_quantities():
    assert inspect.signature(explain) == inspect.signature(describe_problem) == OP.description()
    for q in OP.quantities():
        assert f"{q.name}: {q.doc}" in describe_problem.__doc__


def test_validation_takes_every_argument_that_is_no_launch_option():
    """``op.run`` hands every other argument to ``build_launch_args`` by its parameter names: a
    declared argument missing there would be dropped."""
    taken = set(inspect.signature(validate.build_launch_args).parameters)
    assert taken == set(OP.names) - set(op_mod.LAUNCH_OPTIONS)


def test_encoding_round_trips_and_decoding_fills_the_defaults_the_dispatcher_leaves_out():
    values = OP.complete(dict(zip(OP.positional, range(7)), context_hint=12, backend="torch", config={"b": 1, "a": 2}))
    positional, keywords = OP.encode(values)
    assert keywords["config"] == '{"a": 2, "b": 1}' and OP.decode(positional, keywords) == values
    assert OP.encode(OP.complete(dict(zip(OP.positional, range(7)))))[1]["context_hint"] == signature.NO_HINT
    decoded = OP.decode(tuple(range(7)), {})
    assert decoded == OP.complete(dict(zip(OP.positional, range(7))))  # context_hint None, config None


# ----------------------------------------------------------------------------- spelled-out signatures
def test_the_public_signature_is_the_declarations():
    assert _parameters(torch_op.paged_mqa_logits) == list(OP.python.parameters.values())


def test_the_public_entry_forwards_every_declared_argument_by_name(monkeypatch):
    """Each argument forwarded as itself, without ``locals()`` (which torch 2.11's Dynamo
    cannot trace, breaking ``torch.compile(fullgraph=True)`` of the entry point)."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(torch_op.paged_mqa_logits)))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "locals"]
    seen = {}
    monkeypatch.setattr(torch_op, "call", lambda values: seen.update(values))
    values = {name: object() for name in OP.names}
    positional = [values[name] for name in OP.positional]
    torch_op.paged_mqa_logits(*positional, **{k: v for k, v in values.items() if k not in OP.positional})
    assert seen == values


def test_the_aiter_signature_is_the_declared_positional_part_then_aiters_knobs():
    params = _parameters(aiter.deepgemm_fp8_paged_mqa_logits)
    shared = [p for p in OP.python.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert params[:len(shared)] == shared
    assert [p.name for p in params[len(shared):]] == ["ChunkK", "TotalCuCount", "WavePerEU", "VarCtxSchedule"]


@pytest.mark.parametrize("function,own", [(deep_gemm.fp8_paged_mqa_logits, ["schedule_meta", "indices"]),
                                          (deep_gemm.fp8_fp4_paged_mqa_logits,
                                           ["schedule_meta", "logits_dtype", "indices"])])
def test_the_deep_gemm_signature_maps_onto_the_declaration_in_its_order(function, own):
    params = _parameters(function)
    mapped = [(deep_gemm.OP_NAMES.get(p.name, p.name), p) for p in params]
    ours = [(name, p) for name, p in mapped if name in OP.by_name]
    assert [p.name for name, p in mapped if name not in OP.by_name] == own  # DeepGEMM's own
    assert set(deep_gemm.OP_NAMES.values()) <= set(OP.by_name)
    assert [name for name, _ in ours] == [name for name in OP.names if name in dict(ours)]  # the op's order
    for name, p in ours:
        assert p.default is inspect.Parameter.empty or p.default == OP.by_name[name].default, name
    # what DeepGEMM's call does not name, the wrapper supplies (the logits it allocates, the block size)
    assert {name for name in OP.names if OP.by_name[name].default is signature.REQUIRED} - dict(ours).keys() == {
        "out_logits"}


def test_the_contract_documents_the_declared_signature():
    with open(os.path.join(ROOT, "docs", "CONTRACT.md")) as f:
        text = f.read()
    block = re.search(r"## Signature\n\n((?:    .*\n)+)", text).group(1)
    assert " ".join(block.split()) == f"{OP.text()} -> out_logits"


# ----------------------------------------------------------------------------- adding an argument
BIAS = Argument("row_bias", "Tensor?", "torch.Tensor | None", "per-row biases of the logits.", default=None,
                keyword_only=True, quantities=(Quantity("biased", "a ``row_bias`` is passed", False),))
EXTENDED = OpSignature("with_bias", OP.arguments + (BIAS,))


def test_a_declared_argument_reaches_the_schema_the_signatures_and_the_docs():
    assert EXTENDED.schema() == OP.schema().replace("paged_mqa_logits(", "with_bias(").replace(
        "=None) -> ()", "=None, Tensor? row_bias=None) -> ()")
    assert list(EXTENDED.python.parameters)[-1] == "row_bias" and EXTENDED.python.parameters["row_bias"].kind.name == \
        "KEYWORD_ONLY"
    assert "row_bias: per-row biases of the logits." in EXTENDED.arguments_doc()
    assert list(EXTENDED.description().parameters)[-1] == "biased"
    values = EXTENDED.complete(dict(zip(OP.positional, range(7)), row_bias="s"))
    assert EXTENDED.decode(*EXTENDED.encode(values)) == values


def test_a_declared_argument_reaches_the_registered_implementation():
    library = torch.library.Library("paged_mqa_logits_signature_test", "DEF")
    seen = []
    defined = torch_op.define(library, EXTENDED, seen.append)
    tensors = [torch.zeros(2) for _ in range(6)]
    bias = torch.ones(3)
    defined(*tensors, 5, True, context_hint=7, config='{"ChunkK": 64}', row_bias=bias)
    defined(*tensors, 5)
    assert seen[0]["row_bias"] is bias and seen[0]["config"] == {"ChunkK": 64} and seen[0]["context_hint"] == 7
    assert seen[1] == EXTENDED.complete(dict(zip(EXTENDED.positional, tensors + [5])))  # defaults, decoded
    assert seen[0]["out_logits"] is tensors[3]

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:  # the fake takes the new argument too and writes nothing
        fake = [mode.from_tensor(t) for t in tensors]
        assert defined(*fake, 5, row_bias=mode.from_tensor(bias)) is None
    assert len(seen) == 2


@pytest.mark.parametrize("arguments,problem", [
    ((Argument("a", "int", "int", "", default=1), Argument("b", "int", "int", "")), "non-default argument"),
    ((Argument("a", "int", "int", "", keyword_only=True), Argument("b", "int", "int", "")), "follows a keyword-only"),
    ((Argument("a", "int", "int", ""), Argument("a", "int", "int", "")), "share a name"),
    ((Argument("a", "int", "int", "", mutated=True),), "no Tensor"),
])
def test_a_malformed_declaration_is_refused(arguments, problem):
    with pytest.raises(ValueError, match=problem):
        OpSignature("bad", arguments)


def test_a_call_by_name_needs_every_required_argument_and_no_other():
    complete = dict(zip(OP.positional, range(7)))
    assert OP.complete(complete)["config"] is None
    with pytest.raises(TypeError, match=r"missing \['max_model_len'\], unknown \[\]"):
        OP.complete({k: v for k, v in complete.items() if k != "max_model_len"})
    with pytest.raises(TypeError, match=r"unknown \['q'\]"):
        OP.complete(dict(complete, q=1))
