"""The job's files (`--log-dir`, or the launcher's private temporary folder): checked and opened so that a planted
link or another user's folder cannot redirect what the launcher and the ranks write, or forge what they read.

Invariants:
- A folder is used only when this user owns it and no one else may write in it, unless it is sticky (as /tmp is),
  where others can add entries but not remove or rename ours (OpenSSH's StrictModes).
- Every file is made fresh: an old entry of its name is unlinked (never followed), then created with
  O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, so a link or file someone slips in between makes the open fail
  instead of writing elsewhere. Files are read with O_NOFOLLOW and only when this user owns them.
Imports nothing heavy: ranks use it too.
"""
from __future__ import annotations

import os
import stat

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFolder(Exception):
    """The folder could be written by someone else; the message is one sentence saying which and what to do."""


def check_folder(path: str) -> None:
    """Raise UnsafeFolder unless `path` is a folder this user owns that nobody else may write in."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"--log-dir {path} is not a folder")
    if st.st_uid != os.geteuid():
        raise UnsafeFolder(f"--log-dir {path} belongs to another user (uid {st.st_uid}), who could plant links in "
                           "it; use a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeFolder(f"--log-dir {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}), "
                           f"who could plant links in it; run `chmod go-w {path}` or use another folder")


def remove(path: str) -> None:
    """Unlink `path` (a link itself, never its target) if it exists; OSError if it exists and cannot go."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def create(path: str, mode: str = "wb"):
    """A new file at `path` (mode 0600), replacing an old entry of that name; never follows a link."""
    remove(path)
    return os.fdopen(os.open(path, _NEW, 0o600), mode)


def tail_own(path: str, nbytes: int) -> bytes:
    """The last `nbytes` of `path` if this user owns it; as `read_own` for absent, linked or foreign files."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise PermissionError(f"{path} belongs to another user")
        f.seek(max(0, st.st_size - nbytes))
        return f.read(nbytes)


def read_own(path: str) -> str:
    """The text of `path` if this user owns it; FileNotFoundError if absent, OSError if a link or foreign."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as f:
        if os.fstat(fd).st_uid != os.geteuid():
            raise PermissionError(f"{path} belongs to another user")
        return f.read()
