"""One error hierarchy for casfs, mapped to errno (FUSE) and exit codes (CLI).

CasfsError                      errno EIO,     exit 1
├── UsageError                  EINVAL,        exit 2   bad arguments or values
├── NotFound                    ENOENT,        exit 3
├── Conflict                    EEXIST,        exit 4   name taken with another spec
├── Busy                        EBUSY,         exit 4   in use, locked, or phase in progress
├── Stale                       ESTALE,        exit 4   what the caller read has changed since
├── ReadOnly                    EROFS,         exit 4   a change to a read-only mount or view
├── Corruption                  EIO,           exit 5   a blob failed verification
│   └── MissingBlob             EIO,           exit 5
├── DigestMismatch              EIO,           exit 5   imported content is not what was expected
├── HostileArchive              EINVAL,        exit 2   a tar member that would escape or is refused
├── NoSpace                     ENOSPC,        exit 1   the store's disk (or its database) is full
├── Unavailable                 EIO,           exit 1   a service casfs relies on (the registry) is down
└── UnsupportedFormat           EIO,           exit 1   a store of an unknown (newer) format

of_database() maps SQLite's errors (sqlite3.OperationalError and kin, met anywhere)
into this tree, so that a locked or full database is one clear line, never "unexpected".
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


class NoSpace(CasfsError):
    errno = _errno.ENOSPC
    exit_code = 1


class Unavailable(CasfsError):
    """A service casfs relies on could not be reached; nothing was changed."""


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


# SQLite's primary result codes (an extended code's low byte), as sqlite3 names them:
# spelled here so that this leaf module need not import sqlite3.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 11, 13, 26


def of_database(e: BaseException, disk_full: bool = False) -> CasfsError | None:
    """The CasfsError a SQLite error means, or None if `e` is none (or none of these).
    `disk_full`: the store's disk is known to have no room, which is what an I/O error
    of SQLite's there means (it cannot grow its -shm or -wal file)."""
    code = getattr(e, "sqlite_errorcode", None)
    if not isinstance(code, int) or type(e).__module__ != "sqlite3":
        return None
    primary = code & 0xFF
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return Busy(f"the store's database is locked by another process ({e}): try again")
    if primary == _SQLITE_FULL or (primary == _SQLITE_IOERR and disk_full):
        return NoSpace(f"No space left on device: the store's database cannot grow ({e})")
    if primary == _SQLITE_IOERR:
        name = getattr(e, "sqlite_errorname", "")
        return CasfsError(f"the store's database cannot be read or written: {e} ({name})")
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return Corruption(f"the store's database is damaged: {e}")
    if primary == _SQLITE_READONLY:
        return ReadOnly(f"the store's database cannot be written: {e}")
    return None
