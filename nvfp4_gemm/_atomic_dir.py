"""A directory replaced as a whole: written beside its target, made durable, then swapped in by one rename (or an
atomic exchange where the target exists), so that the path always names one complete directory and a failure
leaves it as it was. What save_pretrained writes its checkpoints through.
"""
from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import sys
import threading

def new_sibling(target: str, what: str) -> str:
    """A new, empty directory beside target, named for this call alone (pid, thread, random), with the
    permissions a plain mkdir gives (the umask's), so that the swapped-in checkpoint has them too."""
    parent, base = os.path.split(target)
    while True:
        path = os.path.join(parent, f".{base[:80]}.nvfp4-{what}-{os.getpid()}-{threading.get_ident()}-"
                                    f"{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def fsync_tree(directory: str) -> None:
    """Data and names on disk before the swap makes them the checkpoint (a crash after it must not leave
    empty files under the final names)."""
    for root, dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_exchange(a: str, b: str) -> bool:
    """Atomically swaps two paths (Linux renameat2 RENAME_EXCHANGE); False where the system or the file
    system has no such call."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def swap_in(staging: str, target: str) -> None:
    """Makes staging the target. A new target (or an empty directory) is one rename; an existing checkpoint is
    exchanged with staging in one step, then removed, so the path always names one complete checkpoint."""
    try:
        os.rename(staging, target)
        _fsync_dir(os.path.dirname(target))
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if _rename_exchange(staging, target):
        _fsync_dir(os.path.dirname(target))
        shutil.rmtree(staging, ignore_errors=True)  # the old checkpoint, now at the staging name
        return
    # Without an atomic exchange: move the old one aside, the new one in, and the old one back on failure.
    # Between the two renames the path is absent; a concurrent save may then fail (with an error).
    old = new_sibling(target, "old")
    os.rename(target, os.path.join(old, "checkpoint"))
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(os.path.join(old, "checkpoint"), target)
        os.rmdir(old)
        raise
    _fsync_dir(os.path.dirname(target))
    shutil.rmtree(old, ignore_errors=True)


def link_or_copy(src: str, dst: str) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


