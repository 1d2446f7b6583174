"""The precompile CLI (``python -m paged_mqa_logits precompile``; the CMake ``precompile``
target runs it): precompile the tuned table's kernels for some archs, optionally verify."""

from __future__ import annotations

import sys

from ..cli import ArgumentParser, int_list, run
from .warmup import WARMUP_DEFAULT_MAX_MODEL_LEN, Family
from .precompile import precompile
from .verify import verify

PROG = "python -m paged_mqa_logits precompile"


# ============================================================================ CLI
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog=PROG,
        description="Precompile the kernels the tuned table can pick into a Triton cache directory "
                    "the package finds at run time (no GPU needed).")
    p.add_argument("--arch", action="append", required=True,
                   help="target (repeatable or ';'-separated): sm_90, gfx942, gfx950, ...")
    p.add_argument("--out", required=True, help="cache directory to fill")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's max_model_len (default: warmup's default); kernels may specialise on it")
    p.add_argument("--batch-sizes", type=int_list, default=None,
                   help="comma-separated batch sizes (default: 1..largest tuned batch of each family)")
    p.add_argument("--lens", choices=("2d", "1d", "both"), default="both", help="context_lens layouts to cover")
    p.add_argument("--no-fallbacks", action="store_true", help="skip the fallback chain's default knobs")
    p.add_argument("--heads", type=int_list, default=None, help="only these heads (comma-separated)")
    p.add_argument("--next-n", type=int_list, default=None, help="only these next_n values (comma-separated)")
    p.add_argument("--kv-block-size", type=int_list, default=None, help="only these block sizes (comma-separated)")
    p.add_argument("--preshuffle", choices=("0", "1"), default=None, help="only this preshuffle setting")
    p.add_argument("--family", action="store_true",
                   help="with all four of --heads/--next-n/--kv-block-size/--preshuffle: also precompile that "
                        "family when the table has no rows for it (the arch's default choices)")
    p.add_argument("--no-launchers", action="store_true", help="skip the C launcher stubs")
    p.add_argument("--verify", action="store_true",
                   help="afterwards, launch every kernel through the real JIT on a simulated device and "
                        "fail if any would compile")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    archs = [x for entry in a.arch for x in entry.replace(",", ";").split(";") if x.strip()]
    batches = a.batch_sizes
    lens = {"2d": (True,), "1d": (False,), "both": (True, False)}[a.lens]
    only = {k: set(v) for k, v in (("heads", a.heads), ("next_n", a.next_n), ("kv_block_size", a.kv_block_size)) if v}
    if a.preshuffle is not None:
        only["preshuffle"] = {a.preshuffle == "1"}
    extra = []
    if a.family:
        if not (a.heads and a.next_n and a.kv_block_size and a.preshuffle is not None):
            p.error("--family needs --heads, --next-n, --kv-block-size and --preshuffle")
        extra = [Family(heads=h, kv_block_size=kv_block_size, preshuffle=a.preshuffle == "1",
                        next_n=tuple(sorted(only["next_n"])),
                        batch_sizes=tuple(batches or range(1, 257)),
                        max_model_len=a.max_model_len or WARMUP_DEFAULT_MAX_MODEL_LEN, lens_2d=lens)
                 for h in sorted(only["heads"]) for kv_block_size in sorted(only["kv_block_size"])]
    summary = precompile(archs, a.out, max_model_len=a.max_model_len, batch_sizes=batches, lens_2d=lens,
                         include_fallbacks=not a.no_fallbacks, launchers=not a.no_launchers, progress=not a.quiet,
                         only=only, extra_families=extra)
    print(summary.describe())
    if summary.errors:
        return 1
    if a.verify:
        result = verify(a.out)
        print(result.describe())
        return 0 if result.ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(run(PROG, main, sys.argv[1:]))
