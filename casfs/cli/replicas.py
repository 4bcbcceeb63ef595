"""`casfs replica ls|set-factor|add|rm|sync|agent`, and what `casfs mount --volume` and
`casfs umount` do for a replicated volume (take `active` and catch up first; publish
and release after): the registry's side of the command line (casfs.replica.registry,
decisions in casfs.replica.records)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from casfs.cli.output import print_json, table
from casfs.cli.store import open_store
from casfs.errors import Busy, NotFound

if TYPE_CHECKING:
    import argparse

    from casfs.replica.registry import Change, Registry, View
    from casfs.repo import Repository


def _registry(args: argparse.Namespace) -> Registry:
    from casfs.replica.registry import open_registry

    return open_registry(getattr(args, "registry", None))


def _rows(view: View) -> list[dict[str, Any]]:
    from casfs.replica import records as rec

    active = view.volume.active.node if view.volume and view.volume.active else None
    return [
        {
            "volume": view.name, "node": e.node, "snapshot": e.snapshot, "root": e.root,
            "lag": rec.lag(e, view.entries), "active": e.node == active, "state": e.state,
            "healthy": rec.healthy(e, view.entries, view.alive), "alive": e.node in view.alive,
            "last_seen": max([e.seen, *(n.seen for n in view.nodes if n.name == e.node)]), "reach": e.reach,
        }
        for e in sorted(view.entries, key=lambda e: e.node)
    ]  # fmt: skip


def cmd_ls(args: argparse.Namespace) -> int:
    reg = _registry(args)
    if args.volume:
        from casfs.replica.registry import require

        view = reg.view(args.volume)
        require(view)
        views = [view]
    else:
        views = reg.views()
    docs: list[dict[str, Any]] = [
        {"volume": v.name, "factor": v.volume.factor, "kind": v.volume.kind,
         "active": None if v.volume.active is None else v.volume.active.node,
         "retention": v.volume.retention, "snapshot_every": v.volume.snapshot_every,
         "takeovers": [t.__dict__ for t in v.volume.takeovers],
         "replicas": _rows(v)}
        for v in views if v.volume is not None
    ]  # fmt: skip
    if args.json:
        print_json(docs if not args.volume else docs[0])
        return 0
    now = time.time()
    lines = [
        [r["volume"], r["node"], str(r["snapshot"]), str(r["lag"]), "yes" if r["active"] else "-",
         "yes" if r["healthy"] else "no", r["state"], _seen(r, now)]
        for d in docs for r in d["replicas"]
    ]  # fmt: skip
    table(["VOLUME", "NODE", "SNAPSHOT", "LAG", "ACTIVE", "HEALTHY", "STATE", "SEEN"], lines)
    return 0


def _seen(row: dict[str, Any], now: float) -> str:
    return "now" if row["alive"] else f"{now - row['last_seen']:.0f}s ago"


def cmd_set_factor(args: argparse.Namespace) -> int:
    from casfs.replica import records as rec
    from casfs.replica.registry import Change

    k = rec.check_factor(_int(args.k, "K"))
    keep = _retention(args)
    reg = _registry(args)
    first = reg.view(args.volume)
    new: rec.Volume | None = None
    if first.volume is None:
        with open_store(args) as repo:
            new = _new_record(repo, args.volume, k)

    def decide(view: View) -> Change:
        if view.volume is None:
            if new is None:
                raise NotFound(f"{args.volume} stopped being replicated meanwhile; try again")
            return Change(volume=new)
        from dataclasses import replace

        volume = replace(view.volume, factor=k)
        return Change(volume=volume if keep is None else replace(volume, retention=keep))

    reg.change(args.volume, decide)
    print(f"{args.volume}: factor {k}" + ("" if keep is None else f", keeping {keep}"))
    return 0


def _retention(args: argparse.Namespace) -> dict[str, int | None] | None:
    """--keep-last/--keep-hourly/--keep-daily as the record's policy; None: unchanged."""
    given = {k: getattr(args, f"keep_{k}") for k in ("last", "hourly", "daily")}
    if all(v is None for v in given.values()):
        return None
    return {k: None if v is None else _int(v, f"--keep-{k}") for k, v in given.items()}


def _new_record(repo: Repository, volume: str, k: int) -> Any:
    from casfs.catalog import volumes as rows
    from casfs.replica import records as rec
    from casfs.replica.land import store_id

    row = rows.volume_row(repo.conn, volume)
    if row is None:
        raise NotFound(f"no volume named {volume!r} in this store (a replicated volume starts from one)")
    return rec.Volume(volume, k, row.kind.value, {"store": store_id(repo), "volume": volume})


def _int(text: str, what: str) -> int:
    from casfs.errors import UsageError

    if not text.isdigit():
        raise UsageError(f"{what} is a whole number, not {text!r}")
    return int(text)


def cmd_add(args: argparse.Namespace) -> int:
    from casfs.replica import records as rec
    from casfs.replica.registry import Change, require

    def decide(view: View) -> Change | None:
        require(view)
        if view.entry(args.node) is not None:
            return None  # (there already: an identical repeat)
        node = next((n for n in view.nodes if n.name == args.node), None)
        if node is None:
            raise NotFound(
                f"no agent of node {args.node!r} is alive (`casfs replica agent --node {args.node}`)"
            )
        return Change(put=[rec.Entry(node.name, node.store, node.reach, state=rec.WANTED, lease=node.lease)])

    _registry(args).change(args.volume, decide)
    print(f"{args.volume}: a replica wanted on {args.node} (its agent pulls it)")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Take NODE's entry out of the count if K others stay healthy; check again once it
    is out (a racing rm may have taken another): put it back and refuse if not."""
    from dataclasses import replace

    from casfs.replica import records as rec
    from casfs.replica.registry import Change, node_name, require

    reg, node = _registry(args), node_name(args.node)

    def leave(view: View) -> Change:
        volume = require(view)
        why = rec.removal_refused(volume, node, view.entries, view.alive)
        if why is not None:
            raise Busy(why)
        entry = view.entry(node)
        assert entry is not None
        return Change(put=[replace(entry, state=rec.LEAVING)])

    reg.change(args.volume, leave)
    after = reg.view(args.volume)
    if after.volume is not None and (
        why := rec.removal_refused(after.volume, node, after.entries, after.alive)
    ):

        def back(view: View) -> Change | None:
            entry = view.entry(node)
            if view.volume is None or entry is None or entry.state != rec.LEAVING:
                return None
            return Change(put=[replace(entry, state=rec.OK)])

        reg.change(args.volume, back)
        raise Busy(f"{why} (checked again after taking it out: put back)")
    print(f"{args.volume}: {node}'s replica is leaving (its agent deletes it)")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from casfs.replica import records as rec
    from casfs.replica.registry import node_name, require

    view = _registry(args).view(args.volume)
    require(view)
    me = node_name(args.node)
    source = rec.source_for(me, view.entries, view.alive)
    if source is None:
        print(f"{args.volume}: {me} holds the newest snapshot already")
        return 0
    from casfs.cli.replica import _report
    from casfs.replica.active import pull_from

    moved = pull_from(open_store(args), source, args.volume, args.remote_casfs)
    _report(moved, False, f"pulled from {source.node}")
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    from casfs.replica.agent import Agent
    from casfs.replica.registry import node_name
    from casfs.repo import store_path

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    store = str(store_path(args.store))

    def recover(repo: Repository) -> None:
        from casfs.upkeep.recovery import recover

        for message in recover(repo):
            logging.getLogger("casfs.replica.agent").info("recovered: %s", message)

    reach = args.reach or store
    agent = Agent(
        _registry(args),
        node_name(args.node),
        store,
        reach,
        args.remote_casfs,
        _bwlimit(args.bwlimit),
        recover,
    )
    agent.run()
    return 0


def _bwlimit(text: str | None) -> int | None:
    from casfs.units import parse_size

    return None if text is None else parse_size(text)


# -- mount and umount of a replicated volume ------------------------------------------


def before_mount(args: argparse.Namespace) -> Registry | None:
    """A read/write mount of a replicated volume: `active` taken for this node and the
    newest snapshot pulled first (replica.active.take). None when there is nothing to
    do (no registry, not replicated, --ro)."""
    from casfs.replica import active
    from casfs.replica.registry import configured, node_name
    from casfs.units import parse_duration

    reg = configured(getattr(args, "registry", None))
    if reg is None or not args.volume or args.ro:
        return None
    every = None if args.snapshot_every is None else parse_duration(args.snapshot_every)
    me = node_name(args.node)
    view = active.take(reg, args.volume, me, lambda: open_store(args), every, args.remote_casfs)
    if view.volume is None:
        return None
    held = view.volume.active
    if held is not None and held.node != me:
        print(
            f"casfs: {args.volume}: taking over active from {held.node} (its lease expired)", file=sys.stderr
        )
    return reg


def after_umount(args: argparse.Namespace, store: str | None, volume: str | None) -> None:
    """The snapshot the unmount took published and `active` released (the followers pull
    it at their next poll); nothing when the volume is not replicated."""
    from casfs.replica.registry import configured, node_name

    reg = configured(getattr(args, "registry", None))
    if reg is None or store is None or volume is None:
        return
    from casfs.replica.active import release
    from casfs.replica.agent import local
    from casfs.replica.registry import RegistryDown
    from casfs.repo import Repository

    repo = Repository.open(store)
    try:
        here = local(repo, volume)
        release(reg, volume, node_name(getattr(args, "node", None)), None if here is None else here[:2])
    except RegistryDown as e:  # (unmounted and saved: the agent publishes it once etcd is back)
        print(
            f"casfs: warning: {e}; this node's agent publishes the snapshot when it is back", file=sys.stderr
        )
    finally:
        repo.close()
