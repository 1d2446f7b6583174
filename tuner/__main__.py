"""``python -m tuner [tune] UNTUNED.csv... -o TABLE.csv`` and ``python -m tuner recheck``.

Installed, the same command line is ``python -m paged_mqa_logits.tuner`` (console script
``paged-mqa-logits-tune``). Errors are one line on stderr and a non-zero exit status;
``--debug`` shows the traceback (:mod:`paged_mqa_logits.cli`).
"""

from __future__ import annotations

import argparse
import os
import sys

from paged_mqa_logits import cli

from .keys import parse_contexts
from .search import MIN_TIME_BUDGET, WHY_MIN_TIME_BUDGET

PROG = f"python -m {__package__ or 'tuner'}"  # "paged_mqa_logits.tuner" once installed
SUBCOMMANDS = ("tune", "recheck")
EXIT_STATUS = ("exit status: 0 every key tuned, already tuned, too large for the free memory (skipped, as the "
               "contexts of a key that do not fit) or left for a later run by the time budget; "
               "1 a key failed (no candidate passed, no backend serves it), nothing was tuned or an input file is malformed; "
               "2 a usage error (including a --time-budget below the minimum), before anything starts; "
               "130 interrupted.")


def _contexts(text: str) -> tuple[int, ...]:
    try:
        return parse_contexts(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}") from None


def _tune_parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(
        prog=PROG,
        description="Tune paged_mqa_logits for the current GPU: check and time every candidate of every backend "
                    "that can serve each key of the untuned CSV(s), and merge the picks into --out. See docs/TUNING.md.",
        epilog=f"commands: '{PROG} [tune] UNTUNED.csv... -o TABLE.csv' tunes (this help); "
               f"'{PROG} recheck --table TABLE.csv' re-times a tuned table's picks ({PROG} recheck --help). "
               f"{EXIT_STATUS}")
    p.add_argument("untuned", nargs="+",
                   help="untuned CSV(s): heads,head_dim,kv_block_size,preshuffle,batch,next_n[,contexts] (with "
                        "--op topk: rows,k[,logits_dtype][,contexts]); a name of the shipped lists "
                        "(glm5_untuned.csv, dsv32_untuned.csv, topk_untuned.csv) that is no file here is the "
                        "shipped one")
    p.add_argument("--op", choices=("mqa_logits", "topk"), default="mqa_logits",
                   help="the op whose rows to tune: the logits op, or the top-k op (untuned lists of rows,k[,"
                        "logits_dtype][,contexts], e.g. the shipped topk_untuned.csv; candidates run in this "
                        "process, so --mp, --jobs and --timeout do not apply; see tuner/topk.py)")
    p.add_argument("-o", "--out", default=None,
                   help="tuned table to write (merged into if it exists); required unless --dry-run")
    p.add_argument("--contexts", type=_contexts, default=None,
                   help="contexts to tune at, e.g. 8192,32768,131072 (default: the file's, else 8192,32768)")
    p.add_argument("--lengths", choices=("uniform", "wide"), default="uniform",
                   help="per-sequence lengths of the timed batches: every sequence at the context, or drawn "
                        "uniformly from [1, context] as in serving decode batches (seeded; the hint is the context)")
    p.add_argument("--backends", default=None, help="only these backends, comma-separated (default: all)")
    p.add_argument("--all", dest="retune_all", action="store_true", help="re-tune keys already in --out")
    p.add_argument("--dry-run", action="store_true", help="list the candidates per key and exit (no GPU needed)")
    p.add_argument("--arch", default=None, help="--dry-run: describe this arch instead of the current device")
    p.add_argument("--cu-num", type=int, default=None,
                   help="--dry-run: CU/SM count of --arch (default: the arch's usual part, paged_mqa_logits/arch.py)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: a GPU if present)")
    p.add_argument("--mp", type=int, default=1, help="timing processes, one per GPU")
    p.add_argument("--jobs", type=int, default=None,
                   help="check/compile processes before timing (default: 16 capped by CPUs on GPU, 0 on CPU)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per candidate (compile included)")
    p.add_argument("--build-timeout", type=float, default=600.0, help="seconds to build one shape's inputs")
    p.add_argument("--time-budget", type=float, default=None,
                   help=f"seconds for the whole run, at least {MIN_TIME_BUDGET:.0f}; no candidate is started once it "
                        "is spent (default: no limit; see docs/TUNING.md)")
    p.add_argument("--top", type=int, default=3, help="candidates per (key, context) re-timed in the confirm stage")
    p.add_argument("--max-candidates", type=int, default=0, help="at most N candidates per backend and key (0: all)")
    p.add_argument("--max-copies", type=int, default=64, help="rotating input copies at most")
    p.add_argument("--screen-replays", type=int, default=None, help="graph replays per screen timing (default: 3)")
    p.add_argument("--confirm-replays", type=int, default=None,
                   help="graph replays per confirm timing (default: GPU 10, CPU 3)")
    p.add_argument("--report", default=None, help="CSV of every measurement and rejection (default: none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _recheck_parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(
        prog=f"{PROG} recheck",
        description="Re-time a tuned table's rows through the production dispatch on this GPU; report drift "
                    "against the recorded us and regressions against a baseline.")
    p.add_argument("--table", required=True, help="the tuned table to re-time")
    p.add_argument("--baseline", default=None,
                   help="an older table, or the --out of an earlier recheck (default: none)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a row is >= --fail x the baseline")
    p.add_argument("--drift", type=float, default=0.10, help="report |measured/recorded - 1| above this")
    p.add_argument("--warn", type=float, default=1.10, help="WARN at this ratio to the baseline")
    p.add_argument("--fail", type=float, default=1.15, help="FAIL at this ratio to the baseline")
    p.add_argument("--out", default=None, help="CSV report, usable as a later --baseline (default: none)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: a GPU if present)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per row")
    p.add_argument("--replays", type=int, default=None, help="graph replays per timing (default: GPU 10, CPU 3)")
    p.add_argument("--max-copies", type=int, default=64, help="rotating input copies at most")
    p.add_argument("--sample", type=int, default=0, help="re-time at most N rows, evenly spread (0: all)")
    p.add_argument("--lengths", choices=("recorded", "uniform", "wide"), default="recorded",
                   help="per-sequence lengths of the timed batches: as each row's provenance records how it was "
                        "tuned (nothing recorded: uniform), or one mode for every row")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _recheck(argv: list[str]) -> int:
    from .recheck import recheck

    a = _recheck_parser().parse_args(argv)
    cli.check_bounds(("--timeout", a.timeout, 0, "above"), ("--replays", a.replays, 1), ("--max-copies", a.max_copies, 1),
                     ("--sample", a.sample, 0), ("--drift", a.drift, 0, "above"), ("--warn", a.warn, 0, "above"),
                     ("--fail", a.fail, 0, "above"))
    return recheck(a.table, baseline=a.baseline, fail_on_regression=a.fail_on_regression, device=a.device,
                   out=a.out, drift=a.drift, warn=a.warn, fail=a.fail, timeout=a.timeout, replays=a.replays,
                   max_copies=a.max_copies, sample=a.sample, quiet=a.quiet,
                   lengths={"recorded": None, "uniform": ""}.get(a.lengths, a.lengths))


def _untuned_file(path: str) -> str:
    """``path``, or, when no such file exists, the shipped untuned list of that file name
    (``glm5_untuned.csv``, ``configs/dsv32_untuned.csv``: an installed package has no
    checkout's ``configs/``)."""
    if os.path.isfile(path):
        return path
    from paged_mqa_logits.table import shipped_config_dir

    shipped = shipped_config_dir() / os.path.basename(path)
    if path.endswith("_untuned.csv") and shipped.is_file():
        return str(shipped)
    looks_like_command = not path.endswith(".csv") and os.sep not in path and "." not in path
    if looks_like_command:
        raise cli.CliError(f"unknown command {path!r} (expected {' or '.join(SUBCOMMANDS)}, or untuned CSV files)")
    raise cli.CliError(f"argument untuned: expected an existing CSV file or a shipped untuned list's name, got {path!r}")


def _tune(argv: list[str]) -> int:
    a = _tune_parser().parse_args(argv)
    a.untuned = [_untuned_file(path) for path in a.untuned]
    if a.out is None and not a.dry_run:
        raise cli.CliError("argument -o/--out: expected the tuned table to write (required unless --dry-run), got none")
    cli.check_bounds(("--time-budget", a.time_budget, 0, "above"), ("--timeout", a.timeout, 0, "above"),
                     ("--build-timeout", a.build_timeout, 0, "above"), ("--cu-num", a.cu_num, 1), ("--mp", a.mp, 1),
                     ("--jobs", a.jobs, 0), ("--top", a.top, 1), ("--max-candidates", a.max_candidates, 0),
                     ("--max-copies", a.max_copies, 1), ("--screen-replays", a.screen_replays, 1),
                     ("--confirm-replays", a.confirm_replays, 0))
    if a.time_budget is not None and a.time_budget < MIN_TIME_BUDGET and not a.dry_run:
        raise cli.CliError(f"argument --time-budget: expected at least {MIN_TIME_BUDGET:.0f} s ({WHY_MIN_TIME_BUDGET}), "
                           f"got {a.time_budget:g}")
    if a.arch is not None:
        from paged_mqa_logits.arch import USUAL_CU_NUM, normalise_arch
        from paged_mqa_logits.validate import arch_rule

        expected = arch_rule(normalise_arch(a.arch), USUAL_CU_NUM)
        if expected is not None:
            raise cli.CliError(f"argument --arch: expected {expected}, got {a.arch}")
    from .search import Options, tune

    opts = Options(
        untuned=a.untuned, out=a.out, contexts=a.contexts,
        backends=[b.strip() for b in a.backends.split(",")] if a.backends else None, retune_all=a.retune_all,
        dry_run=a.dry_run, device=a.device, arch=a.arch, cu_num=a.cu_num, mp=a.mp, jobs=a.jobs, timeout=a.timeout,
        build_timeout=a.build_timeout, time_budget=a.time_budget, top=a.top, max_candidates=a.max_candidates,
        max_copies=a.max_copies, screen_replays=a.screen_replays, confirm_replays=a.confirm_replays, report=a.report,
        quiet=a.quiet, lengths="" if a.lengths == "uniform" else a.lengths, op=a.op)
    outcome = tune(opts)
    if not a.dry_run and not outcome.tuned and (outcome.failed or outcome.left):
        budget = (f"; the time budget of {a.time_budget:g} s ran out before the first key finished (give more "
                  "seconds, fewer keys or fewer --contexts)" if outcome.left else "")
        print(f"[tuner] nothing tuned: {len(outcome.failed)} key(s) failed, {len(outcome.left)} not reached{budget}",
              file=sys.stderr)
        return 1
    return 1 if outcome.failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "recheck":
        return cli.run(f"{PROG} recheck", _recheck, argv[1:])
    if argv and argv[0] == "tune":
        argv = argv[1:]
    return cli.run(PROG, _tune, argv)


if __name__ == "__main__":
    sys.exit(main())
