"""A gRPC service of casfs on a unix socket: the adapter every RPC goes through.

The adapter is thin: each RPC is the handler's method of the same name, called with the
request; around it, three things every RPC gets the same way:

- the in-progress lock: a second RPC that changes a key (a CSI volume id, a containerd
  snapshot key) while one is in progress for the same key gets ABORTED ("an operation
  is pending for …"), not a second attempt. In this process the lock is a set of keys;
  across processes and restarts, a phase in the catalog is the lock.
- errors mapped through codes.py, one table;
- one log line: method, key, code, milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent import futures
from typing import Any

import grpc

from casfs.errors import CasfsError, UsageError
from casfs.grpcsvc.codes import Pending, message_of, status_of
from casfs.metrics import RpcCounts

WORKERS = 8
STOP_GRACE_S = 10.0
KeyOf = Callable[[str, Any], str]  # (method, request) -> the key it changes ('' if none)


class InProgress:
    """The keys an RPC is changing now, in this process."""

    def __init__(self, what: str = "volume") -> None:
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self.what = what

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._lock:
            if key in self._held:
                raise Pending(f"an operation is pending for {self.what} {key!r}")
            self._held.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(key)


class Adapter:
    """How RPCs are wrapped: which change a key (taken under its lock), how a request
    names its key, the logger, the counts (--metrics)."""

    def __init__(
        self,
        log: logging.Logger,
        key_of: KeyOf,
        mutating: Collection[str],
        locks: InProgress,
        counts: RpcCounts | None = None,
    ) -> None:
        self.log, self.key_of, self.mutating, self.locks, self.counts = log, key_of, mutating, locks, counts

    def servicer(self, handler: object, base: type[Any]) -> Any:
        """An instance of the generated servicer `base` whose every RPC calls the method
        of `handler` of the same name. (Any: the generated stubs declare the servicers'
        methods abstract, which a class made at run time cannot show mypy it overrides.)"""
        methods = {
            name: self._rpc(name, getattr(handler, name))
            for name in dir(base)
            if not name.startswith("_") and callable(getattr(handler, name, None))
        }
        return type(f"{base.__name__}Adapter", (base,), methods)()

    def _rpc(self, name: str, fn: Callable[[Any], Any]) -> Callable[[Any, Any, grpc.ServicerContext], Any]:
        def call(_self: object, request: Any, context: grpc.ServicerContext) -> Any:
            key = self.key_of(name, request)
            start = time.monotonic()
            code = grpc.StatusCode.OK
            try:
                with self.locks.hold(key) if key and name in self.mutating else contextlib.nullcontext():
                    return fn(request)
            except Exception as e:
                code = status_of(e)
                if code == grpc.StatusCode.INTERNAL and not isinstance(e, CasfsError):
                    self.log.exception("%s: unexpected error", name)
                context.abort(code, message_of(e))
            finally:
                seconds = time.monotonic() - start
                self.log.info(
                    "%s %s=%s code=%s %.1f ms", name, self.locks.what, key or "-", code.name, seconds * 1000
                )
                if self.counts is not None:
                    self.counts.rpc(name, code.name, seconds)

        call.__name__ = name
        return call


def socket_path(endpoint: str) -> str:
    """unix:///PATH (or unix:/PATH) -> PATH."""
    prefix = "unix://" if endpoint.startswith("unix://") else "unix:"
    path = endpoint[len(prefix) :] if endpoint.startswith(prefix) else ""
    if path.startswith("/") and not path.startswith("//"):
        return path
    raise UsageError(f"invalid endpoint {endpoint!r}: expected unix:///PATH")


def free_socket(path: str) -> None:
    """A socket left by a killed server is removed; anything else there is refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"{path} exists and is not a socket")
    os.unlink(path)


def new_server(endpoint: str, prefix: str) -> tuple[grpc.Server, str]:
    """A server with its socket bound at the endpoint's path (not started); the path."""
    path = socket_path(endpoint)
    free_socket(path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=prefix))
    server.add_insecure_port(f"unix://{path}")
    return server, path


def run_until_signalled(server: grpc.Server, endpoint: str) -> None:
    """Serve until SIGTERM or SIGINT; then finish the RPCs in flight (a grace period)
    and remove the socket."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop(STOP_GRACE_S).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path(endpoint))
