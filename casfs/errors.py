"""One error hierarchy for casfs, mapped to errno (FUSE) and exit codes (CLI).

CasfsError                      errno EIO,     exit 1
├── UsageError                  EINVAL,        exit 2   bad arguments or values
├── NotFound                    ENOENT,        exit 3
├── Conflict                    EEXIST,        exit 4   name taken with another spec
├── Busy                        EBUSY,         exit 4   in use, locked, or phase in progress
├── ReadOnly                    EROFS,         exit 4
├── Corruption                  EIO,           exit 5   a blob failed verification
│   └── MissingBlob             EIO,           exit 5
├── DigestMismatch              EIO,           exit 5   imported content is not what was expected
├── HostileArchive              EINVAL,        exit 2   a tar member that would escape or is refused
└── UnsupportedFormat           EIO,           exit 1   a store of an unknown (newer) format
"""

from __future__ import annotations

import errno as _errno


class CasfsError(Exception):
    errno: int = _errno.EIO
    exit_code: int = 1


class UsageError(CasfsError):
    errno = _errno.EINVAL
    exit_code = 2


class NotFound(CasfsError):
    errno = _errno.ENOENT
    exit_code = 3


class Conflict(CasfsError):
    errno = _errno.EEXIST
    exit_code = 4


class Busy(CasfsError):
    errno = _errno.EBUSY
    exit_code = 4


class Stale(CasfsError):
    """What a caller read has changed since (a view of a volume others wrote)."""

    errno = _errno.ESTALE
    exit_code = 4


class ReadOnly(CasfsError):
    errno = _errno.EROFS
    exit_code = 4


class Corruption(CasfsError):
    errno = _errno.EIO
    exit_code = 5


class MissingBlob(Corruption):
    pass


class DigestMismatch(CasfsError):
    errno = _errno.EIO
    exit_code = 5


class HostileArchive(CasfsError):
    errno = _errno.EINVAL
    exit_code = 2


class UnsupportedFormat(CasfsError):
    errno = _errno.EIO
    exit_code = 1


def error_of_exit_code(code: int, message: str) -> CasfsError:
    """The error a casfs process's exit code stands for (4, conflict or busy, as Busy)."""
    kind = {2: UsageError, 3: NotFound, 4: Busy, 5: Corruption}.get(code, CasfsError)
    return kind(message)


def transient(e: BaseException) -> bool:
    """Whether a second try may not meet `e`: an I/O error (the S3 store's RemoteError
    once its retries ran out, a dropped connection, a timeout), not an answer about the
    blob (Corruption, MissingBlob, a 404's FileNotFoundError) or a local refusal (EACCES).
    (An S3 server's refusal, AccessDenied, is a RemoteError too: retried once, in vain.)"""
    return isinstance(e, OSError) and not isinstance(e, (FileNotFoundError, PermissionError))
