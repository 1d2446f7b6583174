"""The op's arguments, declared once: :data:`OP`.

Every list of the op's arguments is derived from this declaration: the torch.library schema and
the argument lists of the registered implementation and of its fake (``torch_op.py``), the eager
implementation's binding of a call and what it hands to validation (``op.py``), the argument
section of the op's docstring, the keywords of ``explain`` (the quantities the arguments carry,
stated as numbers) and the compat wrappers' forwarding. The signatures that stay spelled out in
Python because callers read them (the public ``paged_mqa_logits`` in upstream's positional
order, the compat functions mirroring upstream's) are checked against it by
``tests/test_signature.py``. docs/ARCHITECTURE.md says where to add an argument.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter

from .errors import PagedMQAArgumentError
from .problem import HEAD_DIM

#: the default of an argument (or quantity) that has none
REQUIRED = inspect.Parameter.empty

#: ``context_hint`` in the schema when there is none (``None`` in Python)
NO_HINT = -1


class Encoding:
    """How a Python value crosses the schema: as itself, for a value of the schema type."""

    def encode(self, value):
        return value

    def decode(self, value):
        return value


class NoneAs(Encoding):
    """``None`` crosses as ``sentinel``, a value the argument's rules reject."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def encode(self, value):
        return self.sentinel if value is None else value

    def decode(self, value):
        return None if value == self.sentinel else value


class JsonObject(Encoding):
    """A dict crosses as its JSON text (keys sorted, so equal dicts give equal text)."""

    def encode(self, value):
        return None if value is None else json.dumps(value, sort_keys=True)

    def decode(self, value):
        """The dict again (another JSON value is left for the op's own check of the argument to
        name); text that is not JSON is the argument's error here."""
        if value is None:
            return None
        try:
            return json.loads(value)
        except ValueError:
            raise PagedMQAArgumentError(f"paged_mqa_logits: argument `config`: expected a JSON object of knobs, "
                                        f"got {value!r}") from None


AS_IS = Encoding()


@dataclass(frozen=True)
class Quantity:
    """A number an argument carries (in its shape, its device or its value) that tells problems
    apart: stated as a number, it is a keyword of ``explain``, which describes a call without
    tensors. ``default`` is the described call's, not necessarily the op's."""

    name: str
    doc: str
    default: object = REQUIRED


@dataclass(frozen=True)
class Argument:
    """One argument of the op."""

    name: str
    schema_type: str  # its torch.library schema type
    annotation: str  # its type where a Python signature spells it
    doc: str
    default: object = REQUIRED  # the Python default
    keyword_only: bool = False
    mutated: bool = False  # written in place: the schema marks it ``(a!)``
    encoding: Encoding = AS_IS  # how the Python value crosses the schema
    quantities: tuple[Quantity, ...] = ()

    @property
    def schema_default(self):
        return REQUIRED if self.default is REQUIRED else self.encoding.encode(self.default)

    def parameter(self, default=REQUIRED, annotation=REQUIRED) -> inspect.Parameter:
        kind = inspect.Parameter.KEYWORD_ONLY if self.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Parameter(self.name, kind, default=default, annotation=annotation)


def getter(names) -> Callable[[Mapping], tuple]:
    """A function giving the values of ``names``, in that order, from a call given by name."""
    names = tuple(names)
    if len(names) >= 2:
        return itemgetter(*names)  # the fast path: calls are forwarded with it
    return lambda values: tuple(values[name] for name in names)


def _schema_literal(value) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise ValueError(f"no schema spelling for the default {value!r}")


class OpSignature:
    """An op's arguments in order, and everything derived from them."""

    def __init__(self, name: str, arguments):
        self.name = name
        self.arguments = tuple(arguments)
        self.by_name = {a.name: a for a in self.arguments}
        if len(self.by_name) != len(self.arguments):
            raise ValueError(f"{name}: two arguments share a name")
        keyword_only = [a.keyword_only for a in self.arguments]
        if keyword_only != sorted(keyword_only):
            raise ValueError(f"{name}: a positional argument follows a keyword-only one")
        for a in self.arguments:
            if a.mutated and not a.schema_type.startswith("Tensor"):
                raise ValueError(f"{name}: `{a.name}` is mutated but is no Tensor")
        self.names = tuple(a.name for a in self.arguments)
        self.positional = tuple(a.name for a in self.arguments if not a.keyword_only)
        self.keyword_only = tuple(a.name for a in self.arguments if a.keyword_only)
        #: the Python signature (raises ValueError for a required argument after a default)
        self.python = inspect.Signature([a.parameter(a.default, a.annotation) for a in self.arguments])
        #: the implementation's signature: the schema's defaults
        self.implementation = inspect.Signature([a.parameter(a.schema_default) for a in self.arguments])
        self._python_defaults = {a.name: a.default for a in self.arguments if a.default is not REQUIRED}
        self._schema_defaults = {a.name: a.schema_default for a in self.arguments if a.default is not REQUIRED}
        self._encoders = tuple((a.name, a.encoding.encode) for a in self.arguments if a.encoding is not AS_IS)
        self._decoders = tuple((a.name, a.encoding.decode) for a in self.arguments if a.encoding is not AS_IS)
        self._tensors = getter(a.name for a in self.arguments if a.schema_type.startswith("Tensor"))
        self._others = getter(a.name for a in self.arguments if not a.schema_type.startswith("Tensor"))

    # ------------------------------------------------------------------ the schema side
    def schema(self) -> str:
        """The torch.library schema: every argument, nothing returned."""
        parts, aliases = [], iter("abcdefghijklmnopqrstuvwxyz")
        for a in self.arguments:
            if a.keyword_only and "*" not in parts:
                parts.append("*")
            schema_type = a.schema_type.replace("Tensor", f"Tensor({next(aliases)}!)", 1) if a.mutated else a.schema_type
            default = "" if a.default is REQUIRED else "=" + _schema_literal(a.schema_default)
            parts.append(f"{schema_type} {a.name}{default}")
        return f"{self.name}({', '.join(parts)}) -> ()"

    def encode(self, values: Mapping) -> tuple[list, dict]:
        """The registered op's positional and keyword arguments for a call given by name."""
        if self._encoders:
            values = dict(values)
            for name, encode in self._encoders:
                values[name] = encode(values[name])
        # comprehensions, not getter(): dynamo traces this when the op is called in a compiled model
        return [values[n] for n in self.positional], {n: values[n] for n in self.keyword_only}

    def decode(self, args: tuple, kwargs: dict) -> dict:
        """The Python values of a call as the dispatcher hands it to the implementation: positional
        ``args``, keyword-only ``kwargs``, without the arguments that equal the schema's default."""
        values = self._schema_defaults.copy()
        values.update(zip(self.positional, args))
        values.update(kwargs)
        for name, decode in self._decoders:
            values[name] = decode(values[name])
        return values

    def same_call(self, values: Mapping, other: Mapping) -> bool:
        """Both calls pass the same tensors (the same objects) and equal other values."""
        return (list(map(id, self._tensors(values))) == list(map(id, self._tensors(other)))
                and self._others(values) == self._others(other))

    # ------------------------------------------------------------------ the Python side
    def bind(self, args: tuple, kwargs: dict) -> dict:
        """A Python call's values by name, defaults filled in (``TypeError`` as Python raises it
        for a call that does not fit the signature)."""
        bound = self.python.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def complete(self, values: Mapping) -> dict:
        """A call given by name, every argument it leaves out at its default."""
        full = self._python_defaults.copy()
        full.update(values)
        if len(full) != len(self.names) or not full.keys() <= self.by_name.keys():
            unknown, missing = sorted(full.keys() - self.by_name.keys()), [n for n in self.names if n not in full]
            raise TypeError(f"{self.name}: a call needs every argument without a default and names no other "
                            f"(missing {missing}, unknown {unknown})")
        return full

    def select(self, values: Mapping) -> dict:
        """The entries of ``values`` that name an argument: what a wrapper with parameters of its
        own forwards to the op."""
        return {name: value for name, value in values.items() if name in self.by_name}

    def text(self) -> str:
        """``name(arguments)`` with defaults, as documentation writes it."""
        plain = self.python.replace(parameters=[p.replace(annotation=REQUIRED) for p in self.python.parameters.values()],
                                    return_annotation=REQUIRED)
        return f"{self.name}{plain}"

    def arguments_doc(self, indent: str = "    ") -> str:
        """The ``Args:`` section of a docstring."""
        lines = [f"{indent}Args:"] + [f"{indent}    {a.name}: {a.doc}" for a in self.arguments]
        return "\n".join(lines)

    # ------------------------------------------------------------------ described calls
    def quantities(self) -> tuple[Quantity, ...]:
        return tuple(q for a in self.arguments for q in a.quantities)

    def description(self) -> inspect.Signature:
        """The keywords of a call described by numbers (``explain``): every quantity."""
        return inspect.Signature([inspect.Parameter(q.name, inspect.Parameter.KEYWORD_ONLY, default=q.default)
                                  for q in self.quantities()])

    def quantities_doc(self, indent: str = "    ") -> str:
        """The ``Keywords:`` section of a docstring."""
        lines = [f"{indent}Keywords:"] + [f"{indent}    {q.name}: {q.doc}" for q in self.quantities()]
        return "\n".join(lines)


_TENSOR = dict(schema_type="Tensor", annotation="torch.Tensor")

#: The op. ``max_model_len`` and ``context_hint`` are ``SymInt`` so that a compiled model does
#: not recompile when the longest context of the step changes; the schema has no dict, so
#: ``config`` crosses it as JSON text.
OP = OpSignature("paged_mqa_logits", (
    Argument("q_fp8", **_TENSOR, doc="``[B, next_n, H, D]`` fp8 e4m3 (fn; fnuz on gfx942), D = 128, next_n 1..8; "
                                     "with ``q_scale``, ``[B, next_n, H, D / 2]`` packed fp4 e2m1 pairs (uint8 or "
                                     "float4_e2m1fn_x2).",
             quantities=(
                 Quantity("arch", "the arch of the tensors' chip (one of ``explain.known_archs()``)"),
                 Quantity("cu_num", "that chip's CU (ROCm) or SM (CUDA) count"),
                 Quantity("batch", "``B``, sequences (dim 0)"),
                 Quantity("next_n", "query rows per sequence (dim 1)"),
                 Quantity("heads", "``H``, query heads (dim 2)"),
                 Quantity("head_dim", "``D`` (dim 3)", HEAD_DIM))),
    Argument("kv_cache", **_TENSOR, doc="``[num_blocks, KVBlockSize, 1, D + 4]`` uint8, keys then fp32 scales per "
                                        "block (the same bytes fp8-typed, and KVBlockSize-1 rows padded to 144 bytes, "
                                        "are accepted); with ``q_scale``, ``[num_blocks, KVBlockSize, 1, D / 2 + 4]`` "
                                        "uint8, packed fp4 keys then int32 words of four ue8m0 exponents per block."),
    Argument("weights", **_TENSOR, doc="``[B * next_n, H]`` float32."),
    Argument("out_logits", **_TENSOR, mutated=True, doc="``[>= B * next_n, >= max_model_len]`` float32 or bfloat16 "
                                                        "(the fp32 result rounded once), written in place.",
             quantities=(Quantity("logits_dtype", "``out_logits``' dtype: ``'fp32'`` or ``'bf16'``", "fp32"),)),
    Argument("context_lens", **_TENSOR, doc="``[B]`` or ``[B, next_n]`` int32.",
             quantities=(Quantity("lens_2d", "``context_lens`` is ``[B, next_n]`` (vLLM's layout), not ``[B]``", True),)),
    Argument("kv_indices", **_TENSOR, doc="``[B, max_blocks]`` int32 block table."),
    Argument("max_model_len", "SymInt", "int", "columns ``>= max_model_len`` are never written.",
             quantities=(Quantity("max_model_len", "``max_model_len`` (default: ``context``, else 32768)", None),)),
    Argument("Preshuffle", "bool", "bool", "key bytes stored in 16x16 tiles (requires ``KVBlockSize % 16 == 0``).",
             default=False, quantities=(Quantity("preshuffle", "``Preshuffle``", False),)),
    Argument("KVBlockSize", "int", "int", "tokens per cache block.", default=1,
             quantities=(Quantity("kv_block_size", "``KVBlockSize``", 64),)),
    Argument("context_hint", "SymInt", "int | None", "host-side longest context of the batch; used only to pick "
             "tuned knobs.", default=None, keyword_only=True, encoding=NoneAs(NO_HINT),
             quantities=(Quantity("context", "``context_hint`` (default: none, which the tables' 'any' rows serve)", None),)),
    Argument("clean_logits", "bool", "bool", "set columns ``[valid_end, max_model_len)`` of every row to ``-inf``.",
             default=False, keyword_only=True),
    Argument("backend", "str?", "str | None", "force a backend instead of the tuned table (one that cannot serve the "
             "call raises instead of falling back).", default=None, keyword_only=True),
    Argument("config", "str?", "dict | None", "the forced backend's knobs (only with ``backend``).", default=None,
             keyword_only=True, encoding=JsonObject()),
    Argument("q_scale", "Tensor?", "torch.Tensor | None", "MXFP4 inputs: ``[B, next_n, H]`` int32, four ue8m0 "
             "exponents per query head (low byte: elements 0..31); ``None``: fp8 inputs.", default=None,
             keyword_only=True,
             quantities=(Quantity("kv_format", "the query/key format: ``'fp8'``, or ``'fp4'`` (a call with "
                                               "``q_scale``)", "fp8"),)),
))
