"""Command line: ``python -m paged_mqa_logits {demo,explain,bench,compile}``."""

from __future__ import annotations

import argparse
import importlib
import sys

import torch

from .problem import HEAD_DIM


def _add_shape_args(p: argparse.ArgumentParser, *, batch: int, next_n: int, heads: int, context: int | None) -> None:
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--next-n", type=int, default=next_n)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--head-dim", type=int, default=HEAD_DIM)
    p.add_argument("--kv-block-size", type=int, default=64)
    p.add_argument("--preshuffle", action="store_true")
    p.add_argument("--context", type=int, default=context, help="context length (host hint for the table lookup)")


def demo(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m paged_mqa_logits demo",
                                description="Synthetic inputs on the best device present, dispatched and checked against the reference.")
    _add_shape_args(p, batch=4, next_n=2, heads=64, context=4096)
    p.add_argument("--device", default=None, help="cuda / cpu (default: a GPU if present)")
    p.add_argument("--lens-1d", action="store_true", help="pass 1-D context_lens instead of vLLM's 2-D layout")
    p.add_argument("--backend", default=None, help="force a backend instead of the tuned table")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from . import dispatch
    from .op import build_launch_args, launch
    from .reference import check_logits, make_inputs, reference_logits

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    fp8 = torch.float8_e4m3fn
    if device != "cpu" and getattr(torch.version, "hip", None):
        from .arch import detect

        fp8 = torch.float8_e4m3fnuz if detect(device).arch == "gfx942" else fp8
    gen = torch.Generator().manual_seed(a.seed)
    # ragged contexts up to --context, one of them exactly --context
    lens = torch.randint(1, a.context + 1, (a.batch,), generator=gen).tolist()
    lens[0] = a.context
    inputs = make_inputs(a.batch, a.next_n, a.heads, lens, kv_block_size=a.kv_block_size, preshuffle=a.preshuffle,
                         fp8_dtype=fp8, lens_2d=not a.lens_1d, max_model_len=a.context, device=device, seed=a.seed)
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"],
                             a.preshuffle, a.kv_block_size, context_hint=a.context)
    sentinel = inputs["out_logits"].clone()
    if a.backend is None:
        choice = dispatch.choose(args.problem)
        print(f"problem : {args.problem.describe()} lens_2d={int(args.problem.lens_2d)} device={device}")
        print(f"dispatch: {choice.describe()}")
    else:
        print(f"problem : {args.problem.describe()} device={device}\ndispatch: forced backend={a.backend}")
    launch(args, backend=a.backend)
    if device != "cpu":
        torch.cuda.synchronize()

    ref = reference_logits(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["context_lens"],
                           inputs["kv_indices"], inputs["max_model_len"], kv_block_size=a.kv_block_size,
                           preshuffle=a.preshuffle)
    check = check_logits(inputs["out_logits"], sentinel, ref)
    ok = check.ok
    print(f"check   : {check.describe()}")
    return 0 if ok else 1


def explain_cmd(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m paged_mqa_logits explain",
                                description="Which backend, knobs and rule a problem gets; no GPU needed.")
    p.add_argument("--arch", required=True, help="gfx942, gfx950, sm90, cpu, ...")
    p.add_argument("--cu-num", type=int, required=True, help="CUs (ROCm) or SMs (CUDA)")
    _add_shape_args(p, batch=1, next_n=1, heads=64, context=None)
    p.add_argument("--lens-1d", action="store_true")
    a = p.parse_args(argv)
    from .explain import explain
    from .table import loaded_files

    choice = explain(arch=a.arch, cu_num=a.cu_num, batch=a.batch, next_n=a.next_n, heads=a.heads,
                     head_dim=a.head_dim, kv_block_size=a.kv_block_size, preshuffle=a.preshuffle,
                     context=a.context, lens_2d=not a.lens_1d)
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


COMMANDS = {
    "demo": (demo, "synthetic inputs on the best device, dispatched and checked against the reference"),
    "explain": (explain_cmd, "which backend/knobs/rule a problem gets (no GPU needed)"),
    "bench": (_delegate("paged_mqa_logits.bench"), "time backends or the dispatch with the BRIEF section 4 method"),
    "compile": (_delegate("paged_mqa_logits.compile"), "cross-compile a backend's candidates for an arch (no GPU needed)"),
    "precompile": (_delegate("paged_mqa_logits.kernel_cache"),
                   "fill the run-time kernel cache with what the tuned table can pick (no GPU needed)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m paged_mqa_logits {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]][0](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
