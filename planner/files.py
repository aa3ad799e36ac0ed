"""The one reader of every input file (model, cluster, GPU, calibration, nodes file, a plan
directory's plan.json): spec files (TOML, JSON, YAML) become plain dicts, with one clear error for
every way a file can be wrong.

A file is read only if it is a regular file (a FIFO, device, socket or directory is refused by name
before it is opened, so `/dev/zero` or a pipe never blocks or streams forever), at most
MAX_FILE_BYTES long, strictly UTF-8, not empty, and of a format named by its extension; its top
level must be a table.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

from cost_models.errors import SpecError

SPEC_SUFFIXES = (".toml", ".json", ".yaml", ".yml")
# The largest input file read: 50x the largest a planner input can reasonably be (a plan.json with
# its prediction is ~20 KB; Hugging Face config.json files are a few KB).
MAX_FILE_BYTES = 1 << 20

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def shown(path: Path | str) -> str:
    """A path as it may appear in a one-line message: control characters and lone surrogates escaped."""
    from planner.text import printable

    return printable(str(path))


def check_regular(path: Path, *, limit: int = MAX_FILE_BYTES) -> os.stat_result:
    """Refuse, without opening it, anything but an existing regular file of at most `limit` bytes."""
    where = shown(path)
    try:
        st = os.stat(path)  # follows symlinks: a link to /dev/zero is judged as /dev/zero
    except FileNotFoundError:
        raise SpecError(f"{where}: no such file") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the name
        raise SpecError(f"{where}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"{where}: is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{where}: is {_kind(st.st_mode)}, expected a regular file")
    if st.st_size > limit:
        raise SpecError(f"{where}: {st.st_size:,} bytes is more than the {limit:,} bytes an input file may hold")
    return st


def read_bytes(path: Path, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; anything else is a SpecError."""
    check_regular(path, limit=limit)
    where = shown(path)
    try:
        # O_NONBLOCK: should the path have been swapped for a FIFO since the stat, open does not wait
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SpecError(f"{where}: expected a regular file")
            raw = f.read(limit + 1)
    except OSError as e:
        raise SpecError(f"{where}: cannot read ({e.strerror})") from None
    if len(raw) > limit:
        raise SpecError(f"{where}: more than the {limit:,} bytes an input file may hold")
    return raw


def read_text(path: Path, *, limit: int = MAX_FILE_BYTES) -> str:
    raw = read_bytes(Path(path), limit=limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{shown(path)}: not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x})") from None
    if not text.strip():
        raise SpecError(f"{shown(path)}: file is empty")
    return text


def read_mapping(path: Path, *, suffixes: tuple[str, ...] = SPEC_SUFFIXES) -> dict[str, Any]:
    """Parse a .toml/.json/.yaml/.yml file (of `suffixes`) whose top level is a table; the extension
    alone says the format."""
    path = Path(path)
    suffix = path.suffix.lower()
    check_regular(path)
    if suffix not in suffixes:
        raise SpecError(f"{shown(path)}: unknown file type {shown(suffix) or '(none)'}; use one of {', '.join(suffixes)}")
    text = read_text(path)
    where = shown(path)
    fmt = {".toml": "TOML", ".json": "JSON"}.get(suffix, "YAML")
    try:
        if fmt == "TOML":
            data: Any = tomllib.loads(text)
        elif fmt == "JSON":
            data = json.loads(text)
        else:
            data = _yaml(text, where)
    except SpecError:
        raise
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply to be a spec") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{where}: malformed TOML: {e}") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        if "integer string conversion" in str(e):  # Python's limit on decimal digits (CVE-2020-10735)
            raise SpecError(f"{where}: malformed {fmt}: a number has more than {sys.get_int_max_str_digits()} digits") from None
        raise SpecError(f"{where}: malformed {fmt}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # yaml.YAMLError and its subclasses
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{where}: malformed {fmt}: {problem}{at}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{where}: the top level must be a table/object of keys, got {type(data).__name__}")
    return data


MAX_DEPTH = 32  # a spec nests 3 levels (a cluster's inline GPU's peak table)


def _yaml(text: str, where: str) -> Any:
    """YAML without aliases (`*name` lets a few lines expand into billions of nodes, each a
    reference to an anchored one walked anew by every reader; no spec needs one) and at most
    MAX_DEPTH levels deep, checked on the parser's events before anything is built."""
    import yaml  # only YAML files pay for the import

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(f"{where}: nested too deeply to be a spec (more than {MAX_DEPTH} levels)")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            mark = event.start_mark
            raise SpecError(f"{where}: YAML alias *{event.anchor} at line {mark.line + 1} column {mark.column + 1}: "
                            "aliases are not accepted in a spec file; write the value out")
    return yaml.safe_load(text)


def load_calibration(path: Path) -> Any:
    """A --calibration file (JSON, as validate --calibrate writes it)."""
    from cost_models.calibration import calibration_from_dict

    try:
        data = read_mapping(Path(path), suffixes=(".json",))
    except SpecError as e:
        raise SpecError(f"--calibration {e}") from None
    return calibration_from_dict(data, where=f"calibration file {shown(path)}")
