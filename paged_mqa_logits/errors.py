"""The errors raised to callers for bad input, whichever path (eager, ``torch.ops``) they take.

* :class:`PagedMQAArgumentError`: a call argument violates the contract (raised before
  ``out_logits`` is touched). A ``ValueError``.
* :class:`PagedMQAEnvironmentError`: an environment variable the package reads holds a value it
  cannot use; the message names the variable. A subclass of the above.
* ``paged_mqa_logits.table.TableError``: a malformed tuned-table file (``file:line`` first).
  A subclass of the above too.
"""

from __future__ import annotations

import re


class PagedMQAArgumentError(ValueError):
    """A call argument violates the contract; raised before ``out_logits`` is touched."""


class PagedMQAEnvironmentError(PagedMQAArgumentError):
    """An environment variable read by the package holds an unusable value."""


def env_flag(name: str, value: str | None) -> bool:
    """``0``/``1`` (also ``false``/``true``, ``off``/``on``, ``no``/``yes``; unset or empty = 0)."""
    text = (value or "0").strip().lower()
    if text in ("", "0", "false", "off", "no"):
        return False
    if text in ("1", "true", "on", "yes"):
        return True
    raise PagedMQAEnvironmentError(f"paged_mqa_logits: environment variable {name}: expected 0 or 1, got {value!r}")


def renamed(error: PagedMQAArgumentError, names: dict[str, str], entry: str | None = None) -> PagedMQAArgumentError:
    """``error`` as a wrapper's caller reads it: every argument name the message puts in backquotes
    that ``names`` maps is spelled the wrapper's way, in one pass (a new name is never renamed
    again), and the leading ``paged_mqa_logits:`` becomes ``entry`` when given."""
    message = re.sub(r"`(\w+)`", lambda m: f"`{names.get(m.group(1), m.group(1))}`", str(error))
    if entry is not None:
        message = message.replace("paged_mqa_logits:", f"{entry}:", 1)
    return type(error)(message)
