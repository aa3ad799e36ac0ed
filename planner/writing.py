"""The one writer of every output (launch --out, validate --out, --png, --calibrate).

- Names are checked before any work: the parent directory exists and is writable, a file name
  fits in 255 bytes, `--out` is not `.`, `..`, `/` or a mount point, and a file is not a directory.
- A directory is written into a temporary sibling and renamed into place; a file into a temporary
  sibling and renamed over the target. An error (disk full included) removes the temporary and
  leaves what was there before untouched.
- `lock(out)` takes an exclusive lock on `.NAME.lock` beside `out` for the whole run, so a second
  run into the same `--out` fails at once with one line; the lock file goes when the run ends.
- A user's existing empty `--out` is kept, with its mode; the files are moved into it.
- Every OSError becomes one SpecError line naming the path and the cause.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from cost_models.errors import SpecError
from planner.files import shown

MAX_NAME_BYTES = 255  # NAME_MAX of Linux and macOS file systems

_CAUSES = {
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENAMETOOLONG: f"file name too long (at most {MAX_NAME_BYTES} bytes a name)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EBUSY: "busy (a mount point or in use)",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.ENOENT: "no such file or directory",
}


def os_error(e: OSError, path: Path | str, what: str) -> SpecError:
    """One line: the flag, the path and the cause."""
    cause = _CAUSES.get(e.errno or 0, e.strerror or str(e))
    return SpecError(f"{what} {shown(path)}: {cause}")


def _writable_dir(parent: Path, path: Path, what: str) -> None:
    if not parent.is_dir():
        raise SpecError(f"{what} {shown(path)}: directory {shown(parent)} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        try:
            readonly = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
        except OSError:
            readonly = False
        why = "is on a read-only file system" if readonly else "is not writable"
        raise SpecError(f"{what} {shown(path)}: directory {shown(parent)} {why}")


def _name_fits(path: Path, what: str) -> None:
    # the temporary sibling adds a dot, 8 random characters and a suffix to the name
    size = len(os.fsencode(path.name))
    if size + 16 > MAX_NAME_BYTES:
        raise SpecError(f"{what} {shown(path)}: the name is {size} bytes; at most {MAX_NAME_BYTES - 16} "
                        f"(file systems allow {MAX_NAME_BYTES})")


def check_dir(out: Path, *, force: bool, what: str = "--out") -> None:
    """An output directory: refused before any work if it cannot be written as a whole."""
    out = Path(out)
    if out.name in ("", ".", "..") or str(out) in (".", ".."):
        raise SpecError(f"{what} {shown(out)}: name a directory to create (or an empty one), not '.', '..' or '/'")
    absolute = Path(os.path.abspath(out))
    if os.path.ismount(absolute):
        raise SpecError(f"{what} {shown(out)}: is a mount point; name a directory inside it")
    _name_fits(out, what)
    if out.exists() and not out.is_dir():
        raise SpecError(f"{what} {shown(out)}: is a file, expected a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise SpecError(f"{what} {shown(out)}: directory is not empty; pass --force to replace it, or pick another directory")
    _writable_dir(absolute.parent, out, what)


def check_file(path: Path, *, what: str, suffix: str) -> None:
    """An output file: refused before any work if it cannot be written."""
    path = Path(path)
    if path.suffix.lower() != suffix:
        raise SpecError(f"{what} {shown(path)}: expected a file name ending in {suffix}")
    _name_fits(path, what)
    if path.is_dir():
        raise SpecError(f"{what} {shown(path)}: is a directory, expected a file name")
    if path.exists() and not path.is_file():
        raise SpecError(f"{what} {shown(path)}: exists and is not a regular file")
    _writable_dir(Path(os.path.abspath(path)).parent, path, what)


def write_file(path: Path, data: bytes, *, what: str, mode: int = 0o644) -> None:
    """`data` into `path` through a temporary sibling renamed over it: all or nothing."""
    path = Path(path)
    parent = Path(os.path.abspath(path)).parent
    tmp = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            _write_synced(f, data)
        tmp.chmod(mode & ~_umask())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise os_error(e, path, what) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _write_synced(f: BinaryIO, data: bytes) -> None:
    """All of `data`, on the disk before the rename that publishes it (a full disk fails here)."""
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def lock(out: Path, *, what: str = "--out") -> Iterator[None]:
    """Hold `.NAME.lock` beside `out` exclusively; a second holder fails at once with one line."""
    out = Path(out)
    absolute = Path(os.path.abspath(out))
    path = absolute.parent / f".{absolute.name}.lock"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if not absolute.parent.is_dir():
                raise SpecError(f"{what} {shown(out)}: directory {shown(absolute.parent)} does not exist") from None
            raise os_error(e, out, what) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpecError(f"{what} {shown(out)}: another planner run is writing it (it holds {shown(path)}); "
                            "wait for it to finish or pick another directory") from None
        try:  # the holder before us may have removed the file after we opened it: lock the one on disk
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        try:
            path.unlink()
        except OSError:
            pass
        os.close(fd)


def write_dir(out: Path, files: dict[str, tuple[bytes, int]], *, force: bool, what: str = "--out") -> None:
    """Every file (name -> (bytes, mode)) into `out`, all or nothing.

    `out` missing: a staging sibling renamed into place. `out` an empty directory: the files are
    moved into it, the directory and its mode kept. `out` non-empty (needs force): it is renamed
    aside, the staging directory renamed into place with the old one's mode, and the old one
    removed; if the second rename fails the old one is put back."""
    out = Path(out)
    check_dir(out, force=force, what=what)
    parent = Path(os.path.abspath(out)).parent
    umask = _umask()
    staging = aside = None
    moved: list[Path] = []
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
        for name, (data, mode) in files.items():
            path = staging / name
            with open(path, "wb") as f:
                _write_synced(f, data)
            path.chmod(mode & ~umask)
        if out.is_dir() and not any(out.iterdir()):
            for name in files:
                os.replace(staging / name, out / name)
                moved.append(out / name)
        elif out.is_dir():
            staging.chmod(stat.S_IMODE(out.stat().st_mode))
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=parent))
            os.replace(out, aside / "dir")
            try:
                os.replace(staging, out)
            except OSError:
                os.replace(aside / "dir", out)
                raise
            staging = None
        else:
            staging.chmod(0o777 & ~umask)
            os.replace(staging, out)
            staging = None
    except OSError as e:
        for path in moved:
            path.unlink(missing_ok=True)
        raise os_error(e, out, what) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
