"""Names people read back in terminals and pages: what they may hold, and how a terminal
shows what they must not.

A job, user or project name is printed by `gpusched jobs` and friends to other users'
terminals: an escape sequence in one (`\\x1b]0;TITLE\\x07\\x1b[2J`) would retitle or clear
them, and a bidi override or zero-width character makes one name pass for another."""

from __future__ import annotations

import unicodedata

# Control (C0, DEL, C1), format (bidi overrides, zero-width), surrogate, and line and
# paragraph separator characters: none is part of a name a person typed.
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_control(char: str) -> bool:
    return unicodedata.category(char) in _CONTROL_CATEGORIES


def check_name(value: str) -> str:
    """A name is neither empty nor blank and holds no control character; a ValueError
    says which (pydantic turns it into a 422 naming the field)."""
    if not value.strip():
        raise ValueError("must not be empty or blank")
    for position, char in enumerate(value):
        if is_control(char):
            raise ValueError(
                f"must not contain control characters ({escape_controls(char)} at "
                f"position {position})"
            )
    return value


def check_no_controls(value: str) -> str:
    """As check_name, for text that may be empty (a label's value)."""
    return check_name(value) if value else value


def escape_controls(text: str) -> str:
    """`text` with each control character written as Python writes it in a string
    (`\\x1b`, `\\n`, `\\u202e`), so a terminal shows it instead of obeying it."""
    if not any(is_control(char) for char in text):
        return text
    return "".join(repr(char)[1:-1] if is_control(char) else char for char in text)


def readable_span(seconds: int) -> str:
    """'604800 s (7d)': the exact value the API takes, and one a person reads."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s"))]
    readable = "".join(p for p in parts if not p.startswith("0")) or "0s"
    return f"{seconds} s ({readable})"
