"""What a ``chrysalis`` node leaves on disk, and how the next start tidies up after a ``kill -9``.

Why: a node killed with SIGKILL runs no clean-up, so it leaves its private temporary
directory (``chrysalis-*`` in the system temporary directory, holding its helper Unix socket)
and the socket file of any ``--listen unix:///PATH``. Left alone, the directories pile up and
the socket path refuses the restarted node ("address ... is in use"), so its children cannot
reconnect.

Temporary directories: each holds a lock file, ``.owner.lock``, on which the owning process
keeps an exclusive ``flock`` for its whole life; the kernel drops the lock when the process
dies, however it dies. The file is created under a temporary name, locked, then renamed into
place, so a directory is never seen with an unlocked lock file while its owner lives.
Every CLI node start first calls :func:`reclaim_dead_tempdirs`: it removes every
``chrysalis-*`` directory of the same user in the system temporary directory whose lock file
it can lock (owner dead); directories without a lock file
(other tools, older releases) and directories of other users are never touched, symbolic
links are not followed, and the scan stops after :data:`MAX_SCANNED` entries.

Socket files: :func:`reclaim_stale_socket` removes a Unix socket file nobody is bound to (a
datagram ``connect`` to it is refused), and only that file: not a live socket (the connect
succeeds), nor anything that is not a socket.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import stat
import tempfile
from typing import Final, final

__all__ = [
    "LOCK_NAME",
    "MAX_SCANNED",
    "PREFIX",
    "OwnedTempDir",
    "reclaim_dead_tempdirs",
    "reclaim_stale_socket",
]

PREFIX: Final = "chrysalis-"
"""Name prefix of a node's private temporary directory."""
LOCK_NAME: Final = ".owner.lock"
"""The lock file inside it, ``flock``-ed by the owner while it lives."""
MAX_SCANNED: Final = 10_000
"""Directory entries looked at per clean-up, at most."""

_OPEN_FLAGS: Final = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def reclaim_dead_tempdirs(parent: str | None = None) -> list[str]:
    """Remove this user's ``chrysalis-*`` directories in ``parent`` (default: the system
    temporary directory) whose owner is dead (their lock file can be locked); returns the
    removed paths. Never raises for what it finds there."""
    base = tempfile.gettempdir() if parent is None else parent
    uid = os.getuid()
    removed: list[str] = []
    try:
        entries = os.scandir(base)
    except OSError:
        return removed
    with entries:
        for count, entry in enumerate(entries):
            if count >= MAX_SCANNED:
                break
            if not entry.name.startswith(PREFIX):
                continue
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                fd = os.open(os.path.join(entry.path, LOCK_NAME), _OPEN_FLAGS)
            except OSError:  # no lock file: not a node's directory (or already gone)
                continue
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_uid == uid and _try_lock(fd):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.path)
            except OSError:
                continue
            finally:
                os.close(fd)
    return removed


@final
class OwnedTempDir:
    """A private ``chrysalis-*`` temporary directory held by this process (see the module
    docstring); ``remove`` deletes it, a killed owner's is removed by the next ``create``."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def create(cls, parent: str | None = None) -> OwnedTempDir:
        """Make and lock a new directory in ``parent`` (default: the system temporary
        directory)."""
        path = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
        try:
            pending = os.path.join(path, LOCK_NAME + ".new")
            fd = os.open(pending, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                if not _try_lock(fd):  # a fresh private file: nobody else can hold it
                    raise OSError(f"cannot lock {pending}")
                os.write(fd, f"{os.getpid()}\n".encode())
                os.rename(pending, os.path.join(path, LOCK_NAME))
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, fd)

    def remove(self) -> None:
        """Delete the directory and release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(fd)


def reclaim_stale_socket(path: bytes | str) -> bool:
    """Remove the Unix socket file at ``path`` when nobody is bound to it; ``True`` when the
    path is free now (removed, or already gone), ``False`` when it must be left alone: a live
    socket, something that is not a socket, an abstract name, or an error."""
    raw = os.fsencode(path)
    if not raw or raw[:1] == b"\0":
        return False
    try:
        before = os.lstat(raw)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISSOCK(before.st_mode):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(raw)
    except ConnectionRefusedError:
        pass  # a socket file nobody is bound to
    except OSError:
        return False
    else:
        return False  # someone is bound there: refuse
    finally:
        probe.close()
    try:
        after = os.lstat(raw)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        return False  # replaced meanwhile: not the file we probed
    with contextlib.suppress(FileNotFoundError):
        os.unlink(raw)
    return True
