"""Turning pydantic's validation errors into the project's one-line SpecError."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from cost_models.errors import SpecError

_VALUE_ERROR = "Value error, "


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Allowed keys of the (nested) model a location points into."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            break
        annotation = current.model_fields[part].annotation
        args = getattr(annotation, "__args__", ()) or (annotation,)
        current = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


# What to give for a required key a hand-written spec is likely to lack.
_MISSING_HINTS = {
    "compute_capability": "give [major, minor] as torch.cuda.get_device_capability() reports it, e.g. [9, 0] "
                          "for an H100 (developer.nvidia.com/cuda-gpus)",
}


def spec_error(e: ValidationError, model: type[BaseModel], where: str) -> SpecError:
    """One line: where, the field, what is wrong, and what is accepted. An unknown key is named
    before the rest: a misspelt key is also the required key that is then missing."""
    errors = e.errors()
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    field = ".".join(str(p) for p in loc)
    kind, msg = err["type"], err["msg"]
    if msg.startswith(_VALUE_ERROR):
        msg = msg[len(_VALUE_ERROR) :]
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        meant = f" (did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?)" if close else ""
        text = f"unknown key {field!r}{meant}; allowed keys: {', '.join(allowed)}"
    elif kind == "missing":
        hint = _MISSING_HINTS.get(str(loc[-1]))
        text = f"missing required key {field!r}" + (f"; {hint}" if hint else "")
    elif field:
        value = err.get("input")
        shown = f" = {value!r}" if not isinstance(value, (dict, list)) else ""
        text = f"{field}{shown}: {msg}"
    else:
        text = msg
    more = len(errors) - 1
    return SpecError(f"{where}: {text}" + (f" (and {more} more)" if more else ""))
