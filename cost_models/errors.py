"""The project's one error type for problems a user can fix, and the characters its one-line
messages (and the names they quote) must not hold raw.

Its message names the field, the value, the rule and what would be accepted, e.g.
`tp(8)·pp(4)·cp(2) = 64 does not divide gpus(96)`. Only the CLI turns it into a red line and
exit code 2; library callers catch it like any ValueError.
"""

import unicodedata

# Bidirectional overrides and isolates reorder what a terminal prints after them (category Cf).
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def unsafe(ch: str) -> bool:
    """A character a one-line message must not print raw: a control character (C0, DEL, C1: escape
    sequences start with one), a lone surrogate (not encodable), or a bidirectional override."""
    return unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI


class SpecError(ValueError):
    """A user-fixable problem with a model, cluster, training spec or layout."""


class LayoutError(SpecError):
    """A layout a framework refuses, where another layout of the same model and training may be
    accepted (the search skips it and goes on); its message starts with "layout: "."""
