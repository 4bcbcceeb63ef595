"""casfs's errors as gRPC status codes, in one table, for every gRPC service casfs
serves (the CSI plugin, the containerd snapshotter): the codes the CSI spec names, which
are also containerd's (errdefs: NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, ...).

The message is casfs's one-line error. gRPC tells apart what casfs's exit codes fold
together (exit 4: a conflict, something in use, something in progress), so a service
raises these kinds where it knows which one it met:

    UsageError, HostileArchive        INVALID_ARGUMENT   missing or malformed arguments,
                                                         an unsupported capability
    OutOfRange                        OUT_OF_RANGE       a capacity casfs cannot give
    NotFound                          NOT_FOUND          unknown volume or snapshot
    Conflict                          ALREADY_EXISTS     a name taken with another spec
    InUse, Unmet, ReadOnly, Stale     FAILED_PRECONDITION  mounted, needed by a clone, not staged
    Busy (and Pending), BadToken      ABORTED            an operation pending on the volume;
                                                         a pagination token not ours (the spec's)
    NoRoom, OSError ENOSPC/EDQUOT     RESOURCE_EXHAUSTED a full store, an unreachable topology
    Unavailable                       UNAVAILABLE        the replica registry (etcd) unreachable
    Corruption, DigestMismatch, rest  INTERNAL
"""

from __future__ import annotations

import errno
import sqlite3

import grpc

from casfs.errors import (
    Busy,
    CasfsError,
    Conflict,
    Corruption,
    DigestMismatch,
    HostileArchive,
    NotFound,
    ReadOnly,
    Stale,
    Unavailable,
    UsageError,
)


class OutOfRange(UsageError):
    """A capacity range no volume of this kind can satisfy."""


class InUse(Busy):
    """The volume (or snapshot) is used: mounted, published, or the source of a clone."""


class Pending(Busy):
    """Another RPC for this volume is in progress (in this plugin, or a phase in the catalog)."""


class Unmet(CasfsError):
    """A precondition the caller must meet first (e.g. publish before stage)."""


class BadToken(CasfsError):
    """A pagination token this plugin did not hand out."""


class NoRoom(CasfsError):
    """The store cannot hold it, or the volume cannot be where it is asked to be."""


CODES: dict[type[BaseException], grpc.StatusCode] = {
    OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    UsageError: grpc.StatusCode.INVALID_ARGUMENT,
    HostileArchive: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
    InUse: grpc.StatusCode.FAILED_PRECONDITION,
    Unmet: grpc.StatusCode.FAILED_PRECONDITION,
    BadToken: grpc.StatusCode.ABORTED,
    ReadOnly: grpc.StatusCode.FAILED_PRECONDITION,
    Stale: grpc.StatusCode.FAILED_PRECONDITION,
    Busy: grpc.StatusCode.ABORTED,
    NoRoom: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    Corruption: grpc.StatusCode.INTERNAL,
    DigestMismatch: grpc.StatusCode.INTERNAL,
    CasfsError: grpc.StatusCode.INTERNAL,
}

FULL = (errno.ENOSPC, errno.EDQUOT)


def status_of(e: BaseException) -> grpc.StatusCode:
    """The code of an error: its nearest class in CODES (an OSError by its errno; SQLite's
    full disk, which it reports as its own error, as a full store)."""
    if _sqlite_full(e):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(e, OSError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED if e.errno in FULL else grpc.StatusCode.INTERNAL
    for kind in type(e).__mro__:
        if kind in CODES:
            return CODES[kind]
    return grpc.StatusCode.INTERNAL


def message_of(e: BaseException) -> str:
    """The one line a caller is told: casfs's message (an OSError's strerror and path)."""
    if _sqlite_full(e):
        return f"no space left in the store (the catalog: {e})"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return " ".join(str(e).split()) or type(e).__name__


def _sqlite_full(e: BaseException) -> bool:
    return isinstance(e, sqlite3.OperationalError) and "full" in str(e)
