"""Command line: ``python -m paged_mqa_logits {demo,explain,bench,compile,precompile}``.

Every subcommand fails like a tool: one line on stderr naming what is wrong and a non-zero
exit status; ``--debug`` shows the traceback instead (see :mod:`paged_mqa_logits.cli`).
"""

from __future__ import annotations

import importlib
import sys

from . import cli
from .problem import HEAD_DIM, KV_FORMATS, LOGITS_DTYPES

PROG = "python -m paged_mqa_logits"

#: problem field -> the option that sets it, so argument errors name what the user typed
OPTION_NAMES = {"arch": "--arch", "cu_num": "--cu-num", "batch": "--batch", "next_n": "--next-n",
                "heads": "--heads", "head_dim": "--head-dim", "kv_block_size": "--kv-block-size",
                "context": "--context"}


def _add_shape_args(p: cli.ArgumentParser, *, batch: int, next_n: int, heads: int, context: int | None,
                    context_help: str) -> None:
    p.add_argument("--batch", type=int, default=batch, help="sequences")
    p.add_argument("--next-n", type=int, default=next_n, help="query tokens per sequence")
    p.add_argument("--heads", type=int, default=heads, help="query heads")
    p.add_argument("--head-dim", type=int, default=HEAD_DIM, help="query/key head dimension")
    p.add_argument("--kv-block-size", type=int, default=64, help="tokens per KV-cache block")
    p.add_argument("--preshuffle", action="store_true", help="keys stored in 16x16 byte tiles")
    p.add_argument("--context", type=int, default=context, help=context_help)
    p.add_argument("--kv-format", default="fp8", choices=KV_FORMATS, help="query/key format (fp4: MXFP4)")
    p.add_argument("--logits-dtype", default="fp32", choices=tuple(LOGITS_DTYPES), help="dtype of the logits")


def _check_shape(a, *, arch: str | None = None, cu_num: int | None = None, known_archs=None) -> None:
    """The op's argument rules on the options: a violation is a usage error naming the option."""
    from .validate import PagedMQAArgumentError, check_problem

    try:
        check_problem(arch=arch, cu_num=cu_num, batch=a.batch, next_n=a.next_n, heads=a.heads, head_dim=a.head_dim,
                      kv_block_size=a.kv_block_size, preshuffle=a.preshuffle, context=a.context, names=OPTION_NAMES,
                      known_archs=known_archs)
    except PagedMQAArgumentError as exc:
        raise cli.CliError(str(exc)) from None


def _demo_fp8(device: str):
    """The fp8 flavour of the demo's inputs: the device's own on ROCm (fnuz on gfx942), else fn."""
    import torch

    from .arch import detect, native_fp8_dtype

    if device != "cpu" and getattr(torch.version, "hip", None):
        return native_fp8_dtype(detect(device).arch)
    return torch.float8_e4m3fn


def _device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError):
        raise cli.CliError(f"argument --device: expected cpu, cuda or cuda:N, got {requested!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise cli.CliError(f"argument --device: expected cpu, cuda or cuda:N, got {requested!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise cli.CliError(f"argument --device: expected cpu (no CUDA/ROCm GPU is present), got {requested!r}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise cli.CliError(f"argument --device: expected a GPU index below {torch.cuda.device_count()}, "
                               f"got {requested!r}")
    return str(device)


def demo(argv: list[str]) -> int:
    from . import backends

    p = cli.ArgumentParser(prog=f"{PROG} demo",
                           description="Synthetic inputs on the best device present, dispatched and checked "
                                       "against the reference; exit status 1 if the check fails.")
    _add_shape_args(p, batch=4, next_n=2, heads=64, context=4096,
                    context_help="longest context (the others are random below it); also the output width")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if present, else cpu)")
    p.add_argument("--lens-1d", action="store_true", help="pass 1-D context_lens instead of vLLM's 2-D layout")
    p.add_argument("--backend", default=None, choices=backends.names(),
                   help="force a backend instead of the tuned table (default: the table's pick)")
    p.add_argument("--seed", type=int, default=0, help="random inputs")
    a = p.parse_args(argv)
    _check_shape(a)
    if a.context < 1:
        raise cli.CliError(f"argument --context: expected an int >= 1, got {a.context}")
    device = _device(a.device)

    import torch

    from . import dispatch
    from .op import build_launch_args, launch
    from .reference import check_logits, make_inputs, reference_logits

    fp8 = _demo_fp8(device)
    gen = torch.Generator().manual_seed(a.seed)
    # ragged contexts up to --context, one of them exactly --context
    lens = torch.randint(1, a.context + 1, (a.batch,), generator=gen).tolist()
    lens[0] = a.context
    inputs = make_inputs(a.batch, a.next_n, a.heads, lens, kv_block_size=a.kv_block_size, preshuffle=a.preshuffle,
                         fp8_dtype=fp8, lens_2d=not a.lens_1d, max_model_len=a.context, device=device, seed=a.seed,
                         head_dim=a.head_dim, kv_format=a.kv_format, logits_dtype=LOGITS_DTYPES[a.logits_dtype])
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"],
                             a.preshuffle, a.kv_block_size, context_hint=a.context, q_scale=inputs["q_scale"])
    sentinel = inputs["out_logits"].clone()
    print(f"problem : {args.problem.describe()} lens_2d={int(args.problem.lens_2d)} device={device}")
    if a.backend is None:
        print(f"dispatch: {dispatch.choose(args.problem, args.target).describe()}")
    else:
        print(f"dispatch: forced backend={a.backend}")
    launch(args, backend=a.backend)
    if device != "cpu":
        torch.cuda.synchronize()

    ref = reference_logits(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["context_lens"],
                           inputs["kv_indices"], inputs["max_model_len"], kv_block_size=a.kv_block_size,
                           preshuffle=a.preshuffle, q_scale=inputs["q_scale"], logits_dtype=inputs["out_logits"].dtype)
    check = check_logits(inputs["out_logits"], sentinel, ref)
    print(f"check   : {check.describe()}")
    return 0 if check.ok else 1


def _explain_topk(argv: list[str]) -> int:
    from .arch import USUAL_CU_NUM, normalise_arch
    from .top_k.validate import MAX_K

    p = cli.ArgumentParser(prog=f"{PROG} explain --topk",
                           description="Which top-k backend, knobs and rule a paged_mqa_logits.topk call gets; no "
                                       "GPU needed. The call is checked with the op's own argument rules first.")
    p.add_argument("--topk", action="store_true", help="explain the top-k op (this command)")
    p.add_argument("--arch", required=True, help="one of " + ", ".join(USUAL_CU_NUM) + " (sm90 and 90 mean sm_90)")
    p.add_argument("--cu-num", type=int, default=None, help="CUs (ROCm) or SMs (CUDA) (default: the arch's usual part)")
    p.add_argument("--batch", type=int, default=64, help="sequences (rows = batch x next_n)")
    p.add_argument("--next-n", type=int, default=1, help="query rows per sequence")
    p.add_argument("--context", type=int, default=32768, help="row width of the logits (max_model_len)")
    p.add_argument("--k", type=int, default=2048, help=f"positions selected per row (1..{MAX_K})")
    p.add_argument("--logits-dtype", default="fp32", choices=tuple(LOGITS_DTYPES), help="dtype of the logits")
    a = p.parse_args(argv)
    from .errors import PagedMQAArgumentError
    from .explain import explain_topk, known_archs
    from .table import loaded_files

    arch = normalise_arch(a.arch)
    cu_num = a.cu_num if a.cu_num is not None else USUAL_CU_NUM.get(arch)
    if cu_num is None:
        if arch in known_archs():
            raise cli.CliError(f"argument --cu-num: expected a count ({arch} has no usual part in arch.py), got none")
        cu_num = 1  # the arch check below names --arch
    try:
        choice = explain_topk(arch=arch, cu_num=cu_num, batch=a.batch, next_n=a.next_n, context=a.context, k=a.k,
                              logits_dtype=a.logits_dtype)
    except PagedMQAArgumentError as exc:
        message = str(exc).replace("paged_mqa_logits.explain: ", "")
        for field, option in {**OPTION_NAMES, "k": "--k", "logits_dtype": "--logits-dtype"}.items():
            message = message.replace(f"argument `{field}`", f"argument {option}")
        raise cli.CliError(message) from None
    print(f"problem : topk arch={arch} cu_num={cu_num} rows={a.batch * a.next_n} (batch {a.batch} x next_n "
          f"{a.next_n}) context={a.context} k={a.k} logits_dtype={a.logits_dtype}")
    print(f"backend : {choice.backend}")
    print("knobs   : " + (", ".join(f"{k}={v}" for k, v in sorted(choice.config.items())) or "(none)"))
    print(f"rule    : {choice.rule}")
    print(f"source  : {choice.source}")
    print("tables  : " + (", ".join(loaded_files()) or "(none)"))
    return 0


def explain_cmd(argv: list[str]) -> int:
    if "--topk" in argv:
        return _explain_topk(argv)
    from .arch import USUAL_CU_NUM, normalise_arch

    usual = ", ".join(f"{k} {v}" for k, v in USUAL_CU_NUM.items())
    p = cli.ArgumentParser(prog=f"{PROG} explain",
                           description="Which backend, knobs and rule a problem gets; no GPU needed. The problem "
                                       "is checked with the op's own argument rules first. 'explain --topk' "
                                       "explains the top-k op instead (its --help lists its options).")
    p.add_argument("--arch", required=True, help="one of " + ", ".join(USUAL_CU_NUM) + " (sm90 and 90 mean sm_90)")
    p.add_argument("--cu-num", type=int, default=None,
                   help=f"CUs (ROCm) or SMs (CUDA) (default: the arch's usual part: {usual})")
    _add_shape_args(p, batch=1, next_n=1, heads=64, context=None,
                    context_help="host-side hint: longest context of the batch (default: none, the table's "
                                 "'any' rows)")
    p.add_argument("--lens-1d", action="store_true", help="1-D context_lens instead of vLLM's 2-D layout")
    a = p.parse_args(argv)
    from .explain import describe_problem, explain, known_archs

    arch = normalise_arch(a.arch)
    cu_num = a.cu_num
    if cu_num is None:
        cu_num = USUAL_CU_NUM.get(arch)
        if cu_num is None and arch in known_archs():
            raise cli.CliError(f"argument --cu-num: expected a count ({arch} has no usual part in arch.py), got none")
    _check_shape(a, arch=arch, cu_num=cu_num, known_archs=known_archs())
    from .table import loaded_files

    kwargs = dict(arch=arch, cu_num=cu_num, batch=a.batch, next_n=a.next_n, heads=a.heads, head_dim=a.head_dim,
                  kv_block_size=a.kv_block_size, preshuffle=a.preshuffle, context=a.context, lens_2d=not a.lens_1d,
                  kv_format=a.kv_format, logits_dtype=a.logits_dtype)
    problem = describe_problem(**kwargs)
    choice = explain(**kwargs)
    print(f"problem : {problem.describe()} lens_2d={int(problem.lens_2d)}")
    print(f"backend : {choice.backend}")
    print("knobs   : " + (", ".join(f"{k}={v}" for k, v in sorted(choice.config.items())) or "(backend defaults)"))
    print(f"rule    : {choice.rule}")
    print(f"source  : {choice.source}")
    for name, why in choice.skipped:
        print(f"skipped : {name}: {why}")
    print("tables  : " + (", ".join(loaded_files()) or "(none)"))
    return 0


def _delegate(module: str):
    def run(argv: list[str]) -> int:
        return importlib.import_module(module).main(argv)

    return run


def _option_value(argv: list[str], option: str) -> str | None:
    """The last value given to ``option`` (``--opt V`` or ``--opt=V``), else ``None``."""
    value = None
    for i, word in enumerate(argv):
        if word == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(option + "="):
            value = word.split("=", 1)[1]
    return value


def _bench(argv: list[str]) -> int:
    # A device the bench cannot use is named here, before the bench tries to allocate on it.
    if "-h" not in argv and "--help" not in argv:
        device = _option_value(argv, "--device")
        if device is not None:
            _device(device)
    return importlib.import_module("paged_mqa_logits.bench").main(argv)


COMMANDS = {
    "demo": (demo, "synthetic inputs on the best device, dispatched and checked against the reference"),
    "explain": (explain_cmd, "which backend/knobs/rule a problem gets, --topk: a top-k call (no GPU needed)"),
    "bench": (_bench, "time backends or the dispatch with the method of docs/BENCHMARK.md"),
    "compile": (_delegate("paged_mqa_logits.aot.compile"), "cross-compile a backend's candidates for an arch (no GPU needed)"),
    "precompile": (_delegate("paged_mqa_logits.aot.cli"),
                   "fill the run-time kernel cache with what the tuned table can pick (no GPU needed)"),
}


def usage() -> str:
    lines = [f"usage: {PROG} {{{','.join(COMMANDS)}}} [options] [--debug]", ""]
    lines += [f"  {name:10s} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", f"'{PROG} COMMAND --help' shows a command's options and their defaults;",
              "--debug shows the traceback of an error instead of its one-line summary."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    words = cli.strip_debug(argv)
    if not words or words[0] in ("-h", "--help"):
        print(usage())
        return 0 if words else cli.USAGE_ERROR
    name = words[0]
    if name not in COMMANDS:
        print(f"{PROG}: error: unknown command {name!r} (expected one of {', '.join(COMMANDS)}; --help lists them)",
              file=sys.stderr)
        return cli.USAGE_ERROR
    rest = argv[argv.index(name) + 1:] + (["--debug"] if "--debug" in argv[:argv.index(name)] else [])
    return cli.run(f"{PROG} {name}", COMMANDS[name][0], rest)


if __name__ == "__main__":
    sys.exit(main())
