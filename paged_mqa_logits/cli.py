"""What every command line of the package shares: errors in one line, defaults in ``--help``.

* :class:`ArgumentParser` shows each option's default in ``--help`` and turns a usage error
  into :class:`CliError` instead of printing usage and exiting;
* :func:`run` is the error boundary of a command: any error (bad argument, bad table,
  unsupported problem, missing optional package) becomes ONE line on stderr,
  ``<prog>: error: <what is wrong>``, and a non-zero exit status (2 for usage errors, 1 for
  the rest, 130 on Ctrl-C); ``--debug`` anywhere on the command line lets the exception
  through instead, traceback and all.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable, Iterator

from .triton_internals.version import TritonMissing

DEBUG_FLAG = "--debug"
USAGE_ERROR, RUNTIME_ERROR, INTERRUPTED = 2, 1, 130
#: optional packages and the extra that installs them (pyproject.toml)
OPTIONAL_PACKAGES = {"flydsl": "rocm", "triton": "triton"}


class CliError(Exception):
    """A usage error: the command line itself is wrong."""



class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the text already speaks of its
    default; flags (off by default), required options and positionals get nothing."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or not action.option_strings or action.required or action.default in (False, argparse.SUPPRESS):
            return text
        shown = "none" if action.default is None else "%(default)s"
        return f"{text} (default: {shown})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with defaults in ``--help`` and usage errors raised as :class:`CliError`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument(DEBUG_FLAG, action="store_true", help="on an error, show the traceback")

    def error(self, message: str):
        raise CliError(message)


@contextlib.contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Within the block, every ``argparse`` parser (including one this package does not
    create itself, a plain ``argparse.ArgumentParser``) raises :class:`CliError` on a usage error."""
    original = argparse.ArgumentParser.error

    def error(self, message):
        raise CliError(message)

    argparse.ArgumentParser.error = error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


def int_list(text: str) -> list[int]:
    """argparse ``type`` for comma-separated ints (``1,8,32``)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def check_bounds(*bounds) -> None:
    """Each ``(option, value, minimum)`` (an int option, ``value >= minimum``) or ``(option,
    value, minimum, "above")`` (seconds or a ratio, ``value > minimum``) must hold; ``None``
    values (option not given) pass. The first violation is a usage error naming the option."""
    for option, value, minimum, *above in bounds:
        if value is None or (value > minimum if above else value >= minimum):
            continue
        expected = f"a number > {minimum}" if above else f"an int >= {minimum}"
        raise CliError(f"argument {option}: expected {expected}, got {value}")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe(exc: BaseException) -> str:
    """What went wrong, in one line, in words a user can act on."""
    if isinstance(exc, TritonMissing):  # already says what to install
        return one_line(exc)
    if isinstance(exc, ImportError) and exc.name:
        package = exc.name.split(".")[0]
        if package in OPTIONAL_PACKAGES:
            return (f"the optional package {package} is not installed "
                    f"(pip install 'paged_mqa_logits[{OPTIONAL_PACKAGES[package]}]')")
        return f"a required package is missing: {one_line(exc)}"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"no such file: {exc.filename}"
    message = one_line(exc)
    if isinstance(exc, (CliError, ValueError, FileNotFoundError, RuntimeError)) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def run(prog: str, main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run ``main(argv)`` as the command ``prog``: its exit status, or one error line."""
    argv = list(argv)
    debug = DEBUG_FLAG in argv
    try:
        with one_line_usage_errors():
            return main(argv)
    except SystemExit as exc:  # --help (0), or code that exits with a message
        if debug or exc.code is None or isinstance(exc.code, int):
            raise
        _say(prog, one_line(exc.code), debug=None)
        return RUNTIME_ERROR
    except KeyboardInterrupt:
        if debug:
            raise
        _say(prog, "interrupted", debug=None)
        return INTERRUPTED
    except CliError as exc:
        if debug:
            raise
        _say(prog, describe(exc), debug=None)
        return USAGE_ERROR
    except Exception as exc:
        if debug:
            raise
        _say(prog, describe(exc), debug=True)
        return RUNTIME_ERROR


def _say(prog: str, message: str, *, debug: bool | None) -> None:
    hint = f" (rerun with {DEBUG_FLAG} for the traceback)" if debug else ""
    print(f"{prog}: error: {message}{hint}", file=sys.stderr, flush=True)


def strip_debug(argv: list[str]) -> list[str]:
    """``argv`` without ``--debug``, for parsers that do not know the flag (the bench's)."""
    return [a for a in argv if a != DEBUG_FLAG]
