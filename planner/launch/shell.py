"""Shell text: every value is quoted once, here, so a model name or a path can never break out of
an argument, a comment or an assignment.

Only two kinds of words reach a script: values, which go through `shlex.quote` (a string with any
character but letters, digits and `@%+=:,./-` becomes one single-quoted word), and `Raw` words,
which the emitters build from fixed text and variable names of their own (`"$MASTER_ADDR:$MASTER_PORT"`).
User text never reaches a comment: comments carry numbers and enum values only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence

from cost_models.errors import SpecError


class Raw(str):
    """A word the emitter wrote itself (a quoted variable expansion); passed through unquoted."""


Word = str | int | float | Raw


def word(value: Word) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        raise TypeError("flags are bare words, not booleans")
    return shlex.quote(str(value))


def assign(name: str, value: Word) -> str:
    """`NAME=value`, the value quoted."""
    assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), name
    return f"{name}={word(value)}"


def command(head: Sequence[Word], args: Iterable[Sequence[Word]], *, indent: str = "  ") -> str:
    """A command over several lines: the head on the first, then one flag with its values per line."""
    lines = [" ".join(word(w) for w in head)]
    lines += [indent + " ".join(word(w) for w in arg) for arg in args]
    return " \\\n".join(lines)


# Slurm reads `#SBATCH` lines itself, without a shell, so their values are not quoted but checked:
# only characters that mean the same to sbatch and to a shell.
_SLURM_SAFE = re.compile(r"[A-Za-z0-9._:+,=@/-]+")


def slurm_value(field: str, value: str) -> str:
    if not _SLURM_SAFE.fullmatch(value):
        raise SpecError(
            f"{field} {value!r}: an #SBATCH value may hold only letters, digits and . _ : + , = @ / -"
        )
    return value


def slug(text: str, *, limit: int = 48) -> str:
    """A Slurm-safe name made from free text (a model name): other characters become '-'."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:limit]
    return out or "planner"
