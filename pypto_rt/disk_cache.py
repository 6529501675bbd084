"""The on-disk cache of compiled code: entries stored under a key, in a folder only the user can write.

The caller (orchestration.program_cache, for host programs) decides what an entry holds and what its key covers;
this module knows only keys (tuples of str and bytes, hashed into the entry's file name), entries (what marshal
writes: plain data and code objects) and whom to trust. Anything unreadable is a miss, never an error.
PYPTO_CACHE_DIR chooses the folder; PYPTO_CACHE_DIR=off disables the cache. Imports only config and errors.

Entries are code this process executes, so whoever can write them can run code as the user. Trust rule (as
OpenSSH's StrictModes): the folder is used only if, opened, it is owned by the user and not writable by group or
others (else one warning, and the run goes on without the cache); every access goes through that open
descriptor, so a path swapped afterwards cannot redirect it. Folders the cache creates are 0700, entries 0600,
written to a new temporary file (O_CREAT|O_EXCL|O_NOFOLLOW) then renamed into place; an entry is read without
following a symlink and only if it is a regular file owned by the user and not writable by others.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import secrets
import stat
import warnings

from pypto_rt import config
from pypto_rt.errors import user_span

_warned: set[str] = set()   # folders this process has warned about (once each)


class CacheWarning(UserWarning):
    """The disk cache of compiled code is not used (an unsafe folder) or an entry was ignored."""


def folder() -> str | None:
    """Where entries live (PYPTO_CACHE_DIR, else ~/.cache/pypto-rt), or None when the cache is off."""
    chosen = config.CACHE_DIR.get()
    if chosen == "off":
        return None
    return chosen or os.path.join(os.path.expanduser("~"), ".cache", "pypto-rt")


def load(key: tuple):
    """The entry stored under `key` (a tuple of str and bytes), or None: off, missing, untrusted or unreadable."""
    where, name = folder(), _name(key)
    folder_fd = _open_folder(where, create=False)
    if folder_fd is None:
        return None
    try:
        return _read_entry(where, folder_fd, name)
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss
        return None
    finally:
        os.close(folder_fd)


def store(key: tuple, entry) -> None:
    """Store `entry` (plain data and code objects: what marshal writes) under `key`; any failure is a skip."""
    where, name = folder(), _name(key)
    folder_fd = _open_folder(where, create=True)
    if folder_fd is None:
        return
    partial = _temp_name(name)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder_fd)
    except FileExistsError:
        _warn(where, f"not writing an entry: something is already at {os.path.join(where, partial)}")
        os.close(folder_fd)
        return
    except OSError:
        os.close(folder_fd)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            marshal.dump(entry, f)
        # atomic: concurrent ranks or runs never read half an entry; replaces a symlink, never follows it
        os.replace(partial, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except (OSError, ValueError):
        _unlink_quietly(partial, folder_fd)
    finally:
        os.close(folder_fd)


def private_subfolder(name: str) -> str | None:
    """`<cache folder>/<name>`, created 0700, for another tool's own cache (the torch compiler's, replay.tier), or
    None when the cache is off or a folder is not to be trusted (the same rule as entries: that tool loads code)."""
    where = folder()
    if where is None:
        return None
    sub = os.path.join(where, name)
    for path in (where, sub):
        fd = _open_folder(path, create=True)
        if fd is None:
            return None
        os.close(fd)
    return sub


def _name(key: tuple) -> str:
    """The entry's file name: a hash of its key."""
    digest = hashlib.sha256()
    for part in key:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
    return digest.hexdigest()[:32] + ".bin"


def _temp_name(name: str) -> str:
    return f"{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _open_folder(where: str | None, create: bool) -> int | None:
    """A descriptor of the cache folder if it may be trusted (see the module docstring), else None."""
    if where is None:
        return None
    try:
        if create:
            _make_private_folders(where)
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    problem = _untrusted(st, "folder")
    if problem is None:
        return fd
    os.close(fd)
    _warn(where, f"the folder {problem}, so the disk cache is not used (another user could plant code the next "
                 f"run executes); make it yours and private (chown, chmod 700) or set PYPTO_CACHE_DIR to a folder "
                 f"of your own ('off' disables the cache)")
    return None


def _make_private_folders(where: str) -> None:
    """Create `where` and its missing parents, each 0700 (as XDG asks of a cache home)."""
    missing = []
    path = os.path.abspath(where)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def _read_entry(where: str, folder_fd: int, name: str) -> dict | None:
    """The unmarshalled entry, or None: missing, a symlink, not a regular file, not the user's, or writable by
    others (O_NONBLOCK: a FIFO planted there is refused instead of blocking the open)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn(where, f"ignoring entry {name}: {e.strerror} (a symlink is never followed)")
        return None
    with os.fdopen(fd, "rb") as f:
        problem = _untrusted(os.fstat(f.fileno()), "entry")
        if problem is not None:
            _warn(where, f"ignoring entry {name}: it {problem}; the program is compiled again")
            return None
        return marshal.load(f)


def _untrusted(st: os.stat_result, what: str) -> str | None:
    """Why a folder or entry with this status must not be trusted, or None."""
    kind = stat.S_ISDIR if what == "folder" else stat.S_ISREG
    if not kind(st.st_mode):
        return "is not a regular file" if what == "entry" else "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _warn(where: str, why: str) -> None:
    """One warning per folder and process, at the user's line that led here."""
    if where in _warned:
        return
    _warned.add(where)
    message, span = f"pypto-rt disk cache {where}: {why}", user_span()
    if span is None:
        warnings.warn(message, CacheWarning, stacklevel=2)
    else:
        warnings.warn_explicit(message, CacheWarning, span.file, span.line)


def _unlink_quietly(name: str, folder_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except OSError:
        pass
