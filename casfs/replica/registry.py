"""The replica registry in etcd: read a volume's record with its entries in one
consistent read, change them with a compare-and-swap transaction, and keep a node
alive on a lease. The rules (who may do what) are casfs.replica.records'.

    --registry etcd://HOST:PORT[,HOST:PORT]/PREFIX      (or $CASFS_REGISTRY)
    etcds://…                                           the same over TLS

TLS and auth as etcdctl takes them from its environment: $ETCDCTL_CACERT (the CA; TLS
on), $ETCDCTL_CERT and $ETCDCTL_KEY (a client certificate), $ETCDCTL_USER
("user:password", for an etcd with auth enabled). Endpoints are tried in order.

The optimistic lock: every change to a volume's keys rewrites its record, and is a
transaction comparing the record's mod revision with the one read (and, for a
takeover, that the old holder's node key is still absent). Two writers racing: the
second's compare fails, it reads again and decides again (`change()` loops).

The agent follows by polling the prefix's revision (one range read, cheap on an idle
registry): the gateway's watch is a long-lived HTTP stream that has to be re-opened and
re-synced after every etcd restart, which the poll does by itself.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from casfs.errors import CasfsError, NotFound, Stale, Unavailable, UsageError
from casfs.replica.records import Entry, Node, Volume

ENV_REGISTRY = "CASFS_REGISTRY"
ENV_NODE = "CASFS_NODE"
TIMEOUT_S = 5.0  # every request's (a down etcd is one clear error, not a hang)
TRIES = 20  # compare-and-swap rounds before a change gives up (contention)


class RegistryDown(Unavailable):
    """etcd could not be reached (exit 1, errno EIO: nothing was changed)."""


def node_name(given: str | None = None) -> str:
    return given or os.environ.get(ENV_NODE) or socket.gethostname()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def _range_end(prefix: str) -> str:
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


@dataclass
class View:
    """One volume as read at `revision`: its record (None: not replicated), entries, the
    alive nodes, and the mod revision each write compares."""

    name: str
    volume: Volume | None
    entries: list[Entry]
    nodes: list[Node]
    revision: int
    record_rev: int = 0  # the record's mod revision (0: absent)

    @property
    def alive(self) -> set[str]:
        return {n.name for n in self.nodes}

    def entry(self, node: str) -> Entry | None:
        return next((e for e in self.entries if e.node == node), None)


@dataclass
class Change:
    """What a decision writes: the record (None: delete it, absent: keep), entries to
    put and to delete, and node keys that must still be absent."""

    volume: Volume | None = None
    keep_volume: bool = True
    put: list[Entry] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    absent_nodes: list[str] = field(default_factory=list)


class Registry:
    """A client of one registry (a URL). Every method is one or a few HTTP requests to
    etcd's gateway, each with a TIMEOUT_S deadline; RegistryDown when none answers."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("etcd", "etcds") or not parts.netloc:
            raise UsageError(f"a registry is etcd://HOST:PORT[,HOST:PORT]/PREFIX, not {url!r}")
        self.url = url
        self.prefix = "/" + parts.path.strip("/") + "/" if parts.path.strip("/") else "/casfs/"
        self.endpoints = [_endpoint(e, url) for e in parts.netloc.split(",")]
        tls = parts.scheme == "etcds" or bool(os.environ.get("ETCDCTL_CACERT"))
        self.protocol = "https" if tls else "http"
        self._clients: list[Any] = []
        self._token: str | None = None

    # -- transport -------------------------------------------------------------------

    def _make(self, host: str, port: int) -> Any:
        import requests
        from etcd3gw.client import Etcd3Client

        session = requests.Session()
        if ca := os.environ.get("ETCDCTL_CACERT"):
            session.verify = ca
        cert, key = os.environ.get("ETCDCTL_CERT"), os.environ.get("ETCDCTL_KEY")
        if cert and key:
            session.cert = (cert, key)
        return Etcd3Client(host, port, self.protocol, timeout=TIMEOUT_S, api_path="/v3/", session=session)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the first endpoint that answers (a user's token fetched first)."""
        from etcd3gw import exceptions

        if not self._clients:
            self._clients = [self._make(h, p) for h, p in self.endpoints]
        last: Exception | None = None
        for client in list(self._clients):
            try:
                if os.environ.get("ETCDCTL_USER") and self._token is None:
                    self._authenticate(client)
                return dict(client.post(client.get_url(path), json=body))
            except (exceptions.ConnectionFailedError, exceptions.ConnectionTimeoutError) as e:
                last = e
                self._clients.remove(client)  # (the next request tries it last)
                self._clients.append(client)
            except exceptions.Etcd3Exception as e:
                raise CasfsError(f"registry {self.url}: {e}") from None
        raise RegistryDown(f"registry {self.url} is unreachable ({type(last).__name__}): nothing changed")

    def _authenticate(self, client: Any) -> None:
        user, _, password = os.environ["ETCDCTL_USER"].partition(":")
        doc = client.post(client.get_url("/auth/authenticate"), json={"name": user, "password": password})
        self._token = str(doc["token"])
        for c in self._clients:
            c.session.headers["Authorization"] = self._token

    # -- keys --------------------------------------------------------------------------

    def _volume_key(self, name: str) -> str:
        return f"{self.prefix}volumes/{name}"

    def _entry_key(self, name: str, node: str) -> str:
        return f"{self.prefix}volumes/{name}/replicas/{node}"

    def _node_key(self, node: str) -> str:
        return f"{self.prefix}nodes/{node}"

    # -- reading -----------------------------------------------------------------------

    def _ranges(self, *prefixes: str) -> tuple[int, list[list[tuple[str, dict[str, Any], int]]]]:
        """Several prefix ranges read in one transaction (one revision): (revision, per
        prefix [(key, value, mod revision)])."""
        ops = [{"request_range": {"key": _b64(p), "range_end": _range_end(p)}} for p in prefixes]
        doc = self._post("/kv/txn", {"success": ops})
        out = []
        for r in doc.get("responses", []):
            kvs = r.get("response_range", {}).get("kvs", [])
            out.append(
                [(_unb64(kv["key"]), json.loads(_unb64(kv["value"])), int(kv["mod_revision"])) for kv in kvs]
            )
        return int(doc["header"]["revision"]), out

    def views(self) -> list[View]:
        """Every replicated volume, read at one revision."""
        revision, (vols, nodes) = self._ranges(f"{self.prefix}volumes/", f"{self.prefix}nodes/")
        alive = [Node.from_json(v) for _, v, _ in nodes]
        by_name: dict[str, View] = {}
        for key, value, mod in vols:
            rest = key[len(self.prefix) + len("volumes/") :]
            name, _, tail = rest.partition("/replicas/")
            view = by_name.setdefault(name, View(name, None, [], alive, revision))
            if tail:
                view.entries.append(Entry.from_json(value))
            else:
                view.volume, view.record_rev = Volume.from_json(value), mod
        return sorted((v for v in by_name.values() if v.volume is not None), key=lambda v: v.name)

    def view(self, name: str) -> View:
        """One volume (its record None when it is not replicated)."""
        revision, (record, entries, nodes) = self._ranges(
            self._volume_key(name), self._volume_key(name) + "/replicas/", f"{self.prefix}nodes/"
        )
        mine = [(v, m) for k, v, m in record if k == self._volume_key(name)]
        volume, rev = (Volume.from_json(mine[0][0]), mine[0][1]) if mine else (None, 0)
        return View(
            name, volume, [Entry.from_json(v) for _, v, _ in entries],
            [Node.from_json(v) for _, v, _ in nodes], revision, rev,
        )  # fmt: skip

    def nodes(self) -> list[Node]:
        _, (nodes,) = self._ranges(f"{self.prefix}nodes/")
        return [Node.from_json(v) for _, v, _ in nodes]

    # -- writing -----------------------------------------------------------------------

    def commit(self, view: View, change: Change) -> bool:
        """Write `change` if nobody changed the volume since `view` was read (its record's
        mod revision, or its absence) and the named nodes are still not alive. False:
        the compare failed, read again."""
        key = self._volume_key(view.name)
        compares: list[dict[str, Any]] = [
            {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(view.record_rev)}
        ]
        for node in change.absent_nodes:
            compares.append({"key": _b64(self._node_key(node)), "target": "CREATE", "result": "EQUAL",
                             "create_revision": "0"})  # fmt: skip
        ops: list[dict[str, Any]] = []
        if change.keep_volume and change.volume is None:
            assert view.volume is not None, "a change to a volume not replicated"
            change.volume = view.volume
        if change.volume is not None:
            ops.append(_put(key, change.volume.to_json()))
        else:
            ops.append({"request_delete_range": {"key": _b64(key)}})
        for e in change.put:
            ops.append(_put(self._entry_key(view.name, e.node), e.to_json()))
        for node in change.delete:
            ops.append({"request_delete_range": {"key": _b64(self._entry_key(view.name, node))}})
        doc = self._post("/kv/txn", {"compare": compares, "success": ops})
        return bool(doc.get("succeeded", False))

    def change(self, name: str, decide: Callable[[View], Change | None]) -> View:
        """Read, decide, commit; again while the compare fails. `decide` returns None for
        nothing to write, or raises to refuse. The view the decision was made on."""
        for _ in range(TRIES):
            view = self.view(name)
            change = decide(view)
            if change is None or self.commit(view, change):
                return view
        raise Stale(f"registry: {name} changed under every one of {TRIES} tries; try again")

    def delete_volume(self, name: str) -> None:
        """The record and every entry (nothing local is touched)."""
        key = self._volume_key(name)
        self._post("/kv/txn", {"success": [
            {"request_delete_range": {"key": _b64(key)}},
            {"request_delete_range": {"key": _b64(key + "/"), "range_end": _range_end(key + "/")}},
        ]})  # fmt: skip

    # -- leases and nodes ----------------------------------------------------------------

    def grant(self, ttl: int) -> int:
        return int(self._post("/lease/grant", {"TTL": ttl, "ID": 0})["ID"])

    def refresh(self, lease: int) -> bool:
        """Keep `lease` alive; False when it expired already (grant another)."""
        doc = self._post("/lease/keepalive", {"ID": lease})
        return int(doc.get("result", {}).get("TTL", -1)) > 0

    def revoke(self, lease: int) -> None:
        self._post("/lease/revoke", {"ID": lease})

    def publish_node(self, node: Node) -> None:
        """NODE's key on its lease: gone when the lease is."""
        value = _b64(json.dumps(node.to_json()))
        self._post(
            "/kv/put", {"key": _b64(self._node_key(node.name)), "value": value, "lease": str(node.lease)}
        )

    def revision(self) -> int:
        """The registry's revision now (changes with any write under any prefix)."""
        doc = self._post("/kv/range", {"key": _b64(self.prefix), "range_end": _range_end(self.prefix),
                                       "count_only": True})  # fmt: skip
        return int(doc["header"]["revision"])


def _put(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"request_put": {"key": _b64(key), "value": _b64(json.dumps(value))}}


def _endpoint(text: str, url: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"a registry endpoint is HOST:PORT, not {text!r} (in {url})")
    return host.strip("[]"), int(port)


def open_registry(url: str | None) -> Registry:
    """The registry of --registry, else $CASFS_REGISTRY; UsageError when neither is set."""
    url = url or os.environ.get(ENV_REGISTRY)
    if not url:
        raise UsageError(f"no registry: give --registry etcd://HOST:PORT/PREFIX or set ${ENV_REGISTRY}")
    return Registry(url)


def configured(url: str | None) -> Registry | None:
    """The registry if one is configured (a mount of a volume then asks it), else None."""
    url = url or os.environ.get(ENV_REGISTRY)
    return Registry(url) if url else None


def require(view: View) -> Volume:
    if view.volume is None:
        raise NotFound(
            f"{view.name} is not replicated (no record in the registry; `casfs replica set-factor`)"
        )
    return view.volume


def each(views: list[View]) -> Iterator[tuple[View, Volume]]:
    for v in views:
        if v.volume is not None:
            yield v, v.volume
