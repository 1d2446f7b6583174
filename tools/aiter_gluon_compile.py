"""Cross-compile AITER's Gluon paged MQA-logits kernels from a local AITER checkout, no GPU.

Run by ``tools/amd_side_by_side.py`` under the interpreter of the Triton that AITER revision
pairs with (a side environment); it imports nothing but Triton and the one AITER file. That file
imports a single helper, ``get_cdna_version`` from ``aiter.ops.triton.gluon.pa_decode_gluon``
(at import time, to pick its MFMA layout form); it is stood in for here, answering for the arch
being compiled, so AITER itself need not be installed.

Input (stdin): JSON ``{"aiter": PATH, "arch": "gfx950", "out": DIR, "kernels": [{"name", "heads",
"chunk_k", "waves", "kv_block_size", "preshuffle", "aligned16"}, ...]}``; output (stdout): one
JSON object per kernel: ``name``, ``ok``, ``error``, ``isa`` (path of the written ISA text),
``seconds``, ``triton``. The kernel is specialised as AITER's own launcher does for a vLLM call:
one program per query row and ``heads`` heads (``ChunkQ = heads``), ``num_warps`` 4,
``waves_per_eu`` = WavePerEU, 16-byte divisibility of the cache pointers and block stride only
when the cache's rows are 16-byte multiples (``aligned16``); the scalar types are read from
the checkout's own launcher (``attention/pa_mqa_logits.py``), which changed between revisions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
import types

import triton

KERNEL_FILE = "aiter/ops/triton/gluon/pa_mqa_logits.py"
LAUNCHER_FILE = "aiter/ops/triton/attention/pa_mqa_logits.py"
CDNA_VERSION = {"gfx942": 3, "gfx950": 4}
PLAIN, PRESHUFFLE = "_gluon_deepgemm_fp8_paged_mqa_logits", "_gluon_deepgemm_fp8_paged_mqa_logits_preshuffle"
#: runtime parameters by name: Triton types (the fp8 pointer type is the arch's)
SCALARS = {"batch_size": "i32", "next_n": "i32", "heads_num": "i32", "stride_q_batch": "i32",
           "stride_q_next_n": "i32", "stride_q_heads": "i32", "stride_k_seq": "i32", "scale_buffer": "*fp32",
           "stride_scale_seq": "i32", "context_len_ptr": "*i32", "kv_indices": "*i32", "weights": "*fp32",
           "stride_w_batch": "i32", "OutLogits_buffer": "*fp32", "stride_out_batch": "i64", "max_model_len": "i32",
           "max_block_len": "i32", "num_block": "i32", "SplitKV": "i32"}
FP8_POINTERS = ("Q_buffer", "KV_buffer")
DIVISIBLE = ("heads_num", "Q_buffer", "stride_q_batch", "stride_q_next_n", "stride_q_heads", "weights",
             "stride_w_batch")
CACHE = ("KV_buffer", "stride_k_seq", "scale_buffer", "stride_scale_seq")
RANGE_32 = ("Q_buffer", "context_len_ptr", "kv_indices", "weights")


def compiler_names():
    """This repository's ``triton_internals.compiler`` (the one home of the Triton internals a
    compile needs: ``GPUTarget``, ``GluonASTSource``), loaded by path: the side environment has
    Triton and nothing else, and the package's own ``__init__`` would import torch."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "paged_mqa_logits",
                        "triton_internals")
    spec = importlib.util.spec_from_file_location("side_triton_internals", os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return importlib.import_module("side_triton_internals.compiler")


def load_kernels(aiter: str, arch: str):
    """AITER's Gluon module, imported with the helper it needs stood in for ``arch``."""
    for name in ("aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton.gluon"):
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    helper = types.ModuleType("aiter.ops.triton.gluon.pa_decode_gluon")
    helper.get_cdna_version = lambda: CDNA_VERSION[arch]
    sys.modules[helper.__name__] = helper
    spec = importlib.util.spec_from_file_location("aiter.ops.triton.gluon.pa_mqa_logits",
                                                  os.path.join(aiter, KERNEL_FILE))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def launcher_types(aiter: str) -> dict[str, str]:
    """The scalar types AITER's own launcher declares (they changed between revisions: the
    output row stride went from i32, with a 32-bit output range, to i64)."""
    path = os.path.join(aiter, LAUNCHER_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return dict(re.findall(r'"(\w+)":\s*"(i32|i64)"', f.read()))


def source(module, arch: str, kernel: dict, declared: dict[str, str]):
    fn = getattr(module, PRESHUFFLE if kernel["preshuffle"] else PLAIN)
    fp8 = "*fp8e4b8" if arch == "gfx942" else "*fp8e4nv"
    types_ = dict(SCALARS, **{n: t for n, t in declared.items() if n in SCALARS})
    signature = {n: fp8 if n in FP8_POINTERS else types_.get(n, "constexpr") for n in fn.arg_names}
    ranged = RANGE_32 + (("OutLogits_buffer",) if types_["stride_out_batch"] == "i32" else ())
    constants = {"ChunkQ": kernel["heads"], "ChunkK": kernel["chunk_k"], "KVBlockSize": kernel["kv_block_size"],
                 "HiddenDim": 128, "CDNA_VERSION": CDNA_VERSION[arch], "ARCH": arch}
    attrs = {}
    for i, n in enumerate(fn.arg_names):
        hints = []
        if n in DIVISIBLE or (n in CACHE and kernel["aligned16"]):
            hints.append(["tt.divisibility", 16])
        if n in ranged:
            hints.append(["tt.pointer_range", 32])
        if hints:
            attrs[(i,)] = hints
    return compiler_names().GluonASTSource(fn=fn, signature=signature, constexprs={k: v for k, v in constants.items()
                                                                   if k in fn.arg_names}, attrs=attrs)


def compile_one(module, arch: str, kernel: dict, out: str, declared: dict[str, str]) -> dict:
    result = {"name": kernel["name"], "ok": False, "error": None, "isa": None, "triton": triton.__version__}
    start = time.perf_counter()
    try:
        compiled = triton.compile(source(module, arch, kernel, declared), target=compiler_names().GPUTarget("hip", arch, 64),
                                  options={"num_warps": 4, "waves_per_eu": kernel["waves"], "num_stages": 2})
    except Exception as exc:  # a compiler error is a result of this tool, reported per kernel
        lines = str(exc).strip().splitlines()
        result["error"] = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
    else:
        result["ok"] = True
        result["isa"] = os.path.join(out, kernel["name"] + ".amdgcn")
        with open(result["isa"], "w") as f:
            f.write(compiled.asm["amdgcn"])
        result["lds_bytes"] = int(compiled.metadata.shared or 0)
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def main() -> int:
    request = json.load(sys.stdin)
    os.makedirs(request["out"], exist_ok=True)
    module = load_kernels(request["aiter"], request["arch"])
    declared = launcher_types(request["aiter"])
    for kernel in request["kernels"]:
        print(json.dumps(compile_one(module, request["arch"], kernel, request["out"], declared)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
