"""File access confined to one directory tree that never follows a link.

A repository, and every command the agent runs, can plant symbolic links (``env ->
/proc/self/environ``, ``other -> ../run-<id>``), hard links and FIFOs in the working
copy. Resolving a path with ``Path.resolve()`` and then opening it is a race and
follows links; here every path is walked one component at a time with ``openat`` and
``O_NOFOLLOW`` from a descriptor of the root, so a link anywhere in the path is refused
rather than followed, and a rename in between cannot redirect the walk.

Paths are repository-relative strings (``src/app.py``); ``..`` components, absolute
paths and NUL bytes are refused before anything is opened. Reads and writes accept only
regular files with a single link; writes go to a temporary file in the same directory
and are renamed over the target, so a symlink at the target is replaced, never followed.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted by the agent must not hang the worker.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
MAX_WALK_ENTRIES = 200_000
MAX_DEPTH = 64


class UnsafePath(Exception):
    """The path leaves the root, crosses a link, or names something that is not a file."""


@dataclass(frozen=True)
class Entry:
    path: str  # repository-relative, "/"-separated
    size: int


def clean(relative: str) -> str:
    """``relative`` normalized (no ``./``, ``..`` detours, doubled slashes); "" is the root.

    Normalizing is purely lexical and happens before anything is opened, so ``a/../b``
    means ``b`` whatever ``a`` is. Absolute paths, paths that climb above the root and
    NUL bytes are refused, because a path that means to leave the root is an attack,
    not a typo.
    """
    text = str(relative).strip().replace("\\", "/")
    if "\x00" in text:
        raise UnsafePath("path contains a NUL byte")
    if text.startswith("/"):
        raise UnsafePath(f"path {relative!r} is outside the working copy (absolute)")
    normalized = posixpath.normpath(text) if text else "."
    if normalized == ".." or normalized.startswith("../"):
        raise UnsafePath(f"path {relative!r} is outside the working copy")
    return "" if normalized == "." else normalized


def from_root(path: str, roots: tuple[str, ...] | list[str]) -> str:
    """``path`` as a repository-relative path when it is absolute under one of ``roots``.

    Models trained on SWE-bench style harnesses write ``/testbed/src/app.py`` or
    ``/workspace/app.py``; those roots name the working copy. The absolute path is
    normalized first, so ``/workspace/../etc/passwd`` is ``/etc/passwd``, under no
    root, and refused like any other absolute path. A relative path is returned as is.
    """
    text = str(path).strip().replace("\\", "/")
    if not text.startswith("/"):
        return text
    normalized = posixpath.normpath(text)
    for root in roots:
        root = posixpath.normpath(root) if root else ""
        if not root or root == "/":
            continue
        if normalized == root:
            return "."
        if normalized.startswith(root + "/"):
            return normalized[len(root) + 1 :]
    raise UnsafePath(
        f"path {path!r} is outside the working copy (absolute paths must be under "
        f"{' or '.join(r for r in roots if r)})"
    )


def _parts(relative: str) -> list[str]:
    cleaned = clean(relative)
    return cleaned.split("/") if cleaned else []


def _open_root(root: str | Path) -> int:
    try:
        return os.open(os.fspath(root), _DIR_FLAGS)
    except OSError as exc:
        raise UnsafePath(f"working copy {root} cannot be opened: {exc.strerror}") from exc


def _open_dir(root: str | Path, parts: list[str], *, create: bool = False) -> int:
    """A descriptor of the directory ``parts`` below ``root``; no component may be a link."""
    fd = _open_root(root)
    try:
        for index, name in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                where = "/".join(parts[: index + 1])
                raise _refusal(exc, where, fd, name) from exc
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _refusal(exc: OSError, where: str, dir_fd: int, name: str) -> Exception:
    """UnsafePath for a link or a non-directory in the way; other errors stay OSErrors."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return exc
    if stat.S_ISLNK(info.st_mode):
        return UnsafePath(f"{where} is a symbolic link; links are not followed")
    if not stat.S_ISDIR(info.st_mode):
        return NotADirectoryError(f"{where} is not a directory")
    return exc


def _check_regular(info: os.stat_result, where: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"{where} is not a regular file")
    if info.st_nlink > 1:
        raise UnsafePath(f"{where} has several hard links; it may be a file outside")


def read_bytes(root: str | Path, relative: str, *, limit: int | None = None) -> bytes:
    """The content of a regular file below ``root`` (at most ``limit`` bytes)."""
    parts = _parts(relative)
    if not parts:
        raise IsADirectoryError("the working copy itself is not a file")
    dir_fd = _open_dir(root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _refusal(exc, "/".join(parts), dir_fd, parts[-1]) from exc
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(f"{'/'.join(parts)} is a directory")
        _check_regular(info, "/".join(parts))
        wanted = info.st_size if limit is None else min(limit, info.st_size)
        chunks: list[bytes] = []
        remaining = wanted
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(root: str | Path, relative: str, *, limit: int | None = None) -> str:
    """The file decoded as UTF-8 (raises UnicodeDecodeError for binary content)."""
    return read_bytes(root, relative, limit=limit).decode("utf-8")


def write_bytes(root: str | Path, relative: str, data: bytes, *, mode: int = 0o644) -> None:
    """Create or replace a regular file below ``root``, creating parent directories.

    The data goes to a temporary file in the target's directory that is renamed over the
    target: the rename replaces a link planted at the target instead of writing through
    it, and a reader never sees half a file.
    """
    parts = _parts(relative)
    if not parts:
        raise IsADirectoryError("the working copy itself is not a file")
    dir_fd = _open_dir(root, parts[:-1], create=True)
    name = parts[-1]
    try:
        with contextlib.suppress(FileNotFoundError):
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(existing.st_mode):
                raise IsADirectoryError(f"{'/'.join(parts)} is a directory")
            if stat.S_ISREG(existing.st_mode):
                mode = stat.S_IMODE(existing.st_mode)
        temporary = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=dir_fd,
        )
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)
        try:
            os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def write_text(root: str | Path, relative: str, text: str) -> None:
    write_bytes(root, relative, text.encode("utf-8"))


def remove(root: str | Path, relative: str) -> None:
    """Delete a file or link (the link itself, never its target) below ``root``."""
    parts = _parts(relative)
    if not parts:
        raise IsADirectoryError("the working copy itself cannot be removed")
    dir_fd = _open_dir(root, parts[:-1])
    try:
        os.unlink(parts[-1], dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def kind(root: str | Path, relative: str) -> str:
    """``file``, ``dir``, ``link``, ``other`` or ``missing`` for the path, links unfollowed."""
    parts = _parts(relative)
    if not parts:
        return "dir"
    try:
        dir_fd = _open_dir(root, parts[:-1])
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    try:
        info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    finally:
        os.close(dir_fd)
    if stat.S_ISLNK(info.st_mode):
        return "link"
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    if stat.S_ISREG(info.st_mode):
        return "file"
    return "other"


def walk(
    root: str | Path,
    relative: str = "",
    *,
    skip_dirs: frozenset[str] = frozenset({".git"}),
    limit: int = MAX_WALK_ENTRIES,
) -> Iterator[Entry]:
    """Regular files below ``root/relative`` in sorted order; links are not descended.

    Directories named in ``skip_dirs`` are skipped at every depth. ``relative`` may name
    a single file, which is then the only entry.
    """
    base = clean(relative)
    if base and kind(root, base) == "file":
        parts = _parts(base)
        dir_fd = _open_dir(root, parts[:-1])
        try:
            info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)
        yield Entry(base, info.st_size)
        return
    fd = _open_dir(root, _parts(base))
    seen = 0

    def descend(dir_fd: int, prefix: str, depth: int) -> Iterator[Entry]:
        nonlocal seen
        with os.scandir(dir_fd) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        for entry in entries:
            seen += 1
            if seen > limit:
                return
            path = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                if entry.name in skip_dirs or depth >= MAX_DEPTH:
                    continue
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue  # replaced by a link or removed since the listing
                try:
                    yield from descend(child, f"{path}/", depth + 1)
                finally:
                    os.close(child)
            elif entry.is_file(follow_symlinks=False):
                yield Entry(path, entry.stat(follow_symlinks=False).st_size)

    try:
        yield from descend(fd, f"{base}/" if base else "", 0)
    finally:
        os.close(fd)
