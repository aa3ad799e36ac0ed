"""Text that survives any terminal: user-supplied text escaped before it is printed, an ASCII
fall-back for the tables' and charts' symbols when a stream cannot encode them (LANG=C,
PYTHONIOENCODING=ascii, as on many batch nodes), and JSON without NaN or Infinity."""

from __future__ import annotations

import codecs
import math
import sys
from typing import Any

from cost_models.errors import unsafe


def printable(text: str) -> str:
    """`text` with every unsafe character written as a Python escape (\\x1b, \\u202e, \\udcff)."""
    if not any(unsafe(ch) for ch in text):
        return text
    return "".join(ascii(ch)[1:-1] if unsafe(ch) else ch for ch in text)


# What the tables, charts and messages print beyond ASCII, and their ASCII stand-ins.
ASCII_FALLBACK = {
    "·": ".", "█": "#", "▏": "|", "▎": "|", "▍": "|", "▌": "|", "▋": "|", "▊": "|", "▉": "|", "░": ".", "▒": ":",
    "—": "-", "–": "-", "−": "-", "…": "...", "×": "x", "→": "->", "←": "<-", "≤": "<=", "≥": ">=", "≈": "~",
    "±": "+/-", "≠": "!=", "✓": "ok", "✗": "x", "•": "*", "°": " deg", "µ": "u", "²": "^2", "³": "^3",
    "─": "-", "━": "-", "│": "|", "┃": "|", "┌": "+", "┐": "+", "└": "+", "┘": "+", "├": "+", "┤": "+",
    "┬": "+", "┴": "+", "┼": "+", "╭": "+", "╮": "+", "╯": "+", "╰": "+", "═": "=", "║": "|",
    "‘": "'", "’": "'", "“": '"', "”": '"',
}
_HANDLER = "planner-ascii"


def _fallback(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    bad = err.object[err.start : err.end]
    return "".join(ASCII_FALLBACK.get(ch) or ascii(ch)[1:-1] for ch in bad), err.end


codecs.register_error(_HANDLER, _fallback)
_PROBE = "".join(ASCII_FALLBACK)


def fit_streams() -> None:
    """Give stdout and stderr the ASCII fall-back when their encoding cannot write the symbols:
    the characters of ASCII_FALLBACK become their stand-ins, any other a Python escape (\\xe4)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "ascii"
        try:
            _PROBE.encode(encoding)
            continue
        except (UnicodeEncodeError, LookupError):
            pass
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors=_HANDLER)
            except (ValueError, OSError):  # a stream that cannot change its error handler: leave it
                pass


def finite_json(value: Any) -> Any:
    """A JSON document with every non-finite number replaced by null, and beside it a `KEY_note`
    that says what it was ("infinite", "not a number"): `json.dumps(allow_nan=False)` holds."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[k] = finite_json(v)
            if isinstance(v, float) and not math.isfinite(v):
                out[f"{k}_note"] = "not a number" if math.isnan(v) else ("infinite" if v > 0 else "minus infinite")
        return out
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
