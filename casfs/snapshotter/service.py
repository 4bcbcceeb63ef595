"""containerd's snapshotter model over casfs volumes, without gRPC (the servicer is a
thin adapter over this).

    Prepare(key, parent)  a read/write directory volume: blank, or an O(1) clone of the
                          parent's casfs snapshot; served by the store mount (mounts.py)
    View(key, parent)     the same, read-only
    Commit(name, key)     the active volume released by the store mount (flushed) and
                          snapshotted at rest: the committed snapshot is that VOL@N
    Remove(key)           its volume released and removed (a committed one: the volume
                          and its snapshot); refused while it has children
    Cleanup               gc: frees the blobs nothing holds any more

Unpack-free pulls: a Prepare whose `containerd.io/snapshot.ref` label names a layer
chain casfs holds (an image imported with `casfs image import`, whose every prefix of
layers is kept: catalog image_chains) makes the committed snapshot of that chain at once
(a clone of the kept tree, O(1)) and answers AlreadyExists, containerd's remote-snapshot
convention (stargz, nydus): containerd then finds it by the label and skips the layer.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from casfs import volumes
from casfs.errors import CasfsError, Conflict, NotFound, UsageError
from casfs.grpcsvc.codes import Pending
from casfs.ids import SnapshotNo
from casfs.lifecycle.faults import fault_point
from casfs.refcount.accounts import volume_figures
from casfs.repo import Repository
from casfs.snapshots.tree import Tree
from casfs.snapshotter import records
from casfs.snapshotter.mounts import Mounts
from casfs.snapshotter.records import NotActive, Record
from casfs.store.ids import BlobId

log = logging.getLogger("casfs.snapshotter")
REF_LABEL = "containerd.io/snapshot.ref"  # the layer chain id a snapshot is (containerd's unpacker)


class Snapshotter:
    def __init__(self, repo: Repository, root: Path) -> None:
        self.repo = repo
        self.mounts = Mounts(repo, root)

    # -- making ------------------------------------------------------------------------

    def prepare(self, key: str, parent: str, labels: dict[str, str], read_only: bool = False) -> str:
        """A new active (or view) snapshot; the path of its mount."""
        records.check_key(key)
        labels = records.check_labels(labels)
        target = labels.get(REF_LABEL)
        if target and not read_only and self._held(target, parent, labels):
            raise Conflict(f"target snapshot {target!r} already exists (casfs holds its layers)")
        volume = records.volume_name(key, unique=True)
        rec = Record(key, "view" if read_only else "active", parent, volume, labels=labels)
        records.claim_new(self.repo, rec)
        try:
            if parent:
                source = volumes.Source(snapshot=records.get(self.repo, parent).ref)
            else:
                source = volumes.Source(blank_dir=True)
            volumes.create_volume(self.repo, rec.volume, source, read_only=read_only)
            fault_point("snapshotter:prepared")
            self.mounts.ensure()
        except BaseException:
            self._undo(rec)
            raise
        records.settle(self.repo, key)
        return self.mounts.path(rec.volume)

    def _held(self, target: str, parent: str, labels: dict[str, str]) -> bool:
        """True if the committed snapshot of layer chain `target` on `parent` exists or
        is made now from a tree casfs keeps (False: containerd unpacks the layer)."""
        name = chain_name(target, parent)
        if records.find(self.repo, name) is not None:
            return True
        rec = Record(name, "committed", parent, records.volume_name(name), labels=labels)
        try:
            records.claim_new(self.repo, rec)
        except Conflict:
            return True  # (made meanwhile)
        try:
            volumes.clone_chain(self.repo, rec.volume, target, read_only=True)
        except NotFound:
            records.forget(self.repo, name)
            return False
        except BaseException:
            self._undo(rec)
            raise
        n = volumes.create_snapshot(self.repo, rec.volume, label=f"containerd {target}")
        records.settle(self.repo, name, snapshot=int(n))
        log.info("chain %s: held by casfs, committed as %r without unpacking", target, name)
        return True

    def _undo(self, rec: Record) -> None:
        """What a failed (or crashed) Prepare made is removed, and its record."""
        try:
            if rec.kind != "committed":
                self.mounts.release(rec.volume)
            volumes.remove_volume(self.repo, rec.volume, if_exists=True)
        finally:
            records.forget(self.repo, rec.key)

    def mounts_of(self, key: str) -> tuple[str, bool]:
        """(the mount path, read-only) of an active or view snapshot, the store mount
        started again if its daemon is not live (after a reboot, or a daemon that died)."""
        rec = records.get(self.repo, records.check_key(key))
        if rec.kind == "committed":
            raise NotActive(f"snapshot {key!r} is committed: it has no mounts (View or Prepare on it)")
        if rec.phase != "ready":
            raise Pending(f"snapshot {key!r} is {rec.phase}")
        self.mounts.ensure()
        return self.mounts.path(rec.volume), rec.kind == "view"

    def commit(self, name: str, key: str, labels: dict[str, str]) -> Record:
        records.check_key(name, "name")
        records.check_key(key)
        labels = records.check_labels(labels)
        records.name_free(self.repo, name)
        rec = records.take(self.repo, key, "committing", ("active",))
        try:
            self.mounts.release(rec.volume)
            n = int(volumes.create_snapshot(self.repo, rec.volume, label=f"containerd {name}"[:128]))
            fault_point("snapshotter:committing")
            return records.committed(self.repo, rec, name, n, labels)
        except BaseException:
            records.settle(self.repo, key)  # (active again: mounted on its next Mounts)
            raise

    # -- removing ----------------------------------------------------------------------

    def remove(self, key: str) -> None:
        rec = records.take(self.repo, records.check_key(key), "removing", records.KINDS)
        self._finish_remove(rec)

    def _finish_remove(self, rec: Record) -> None:
        try:
            if rec.kind != "committed":
                self.mounts.release(rec.volume)
            volumes.remove_volume(self.repo, rec.volume, if_exists=True)
        except BaseException:
            records.settle(self.repo, rec.key)
            raise
        records.forget(self.repo, rec.key)

    def cleanup(self) -> None:
        from casfs.refcount.gc import gc

        report = gc(self.repo)
        log.info("cleanup: %s", report)

    # -- reading -----------------------------------------------------------------------

    def stat(self, key: str) -> Record:
        return records.get(self.repo, records.check_key(key))

    def update(self, key: str, labels: dict[str, str], paths: list[str]) -> Record:
        """Labels only (containerd's rule: name, parent, kind and times are not updated):
        `paths` empty replaces them all; "labels" too; "labels.KEY" sets or removes one."""
        rec = records.get(self.repo, records.check_key(key))
        labels = records.check_labels(labels)
        new = dict(rec.labels)
        if not paths or "labels" in paths:
            new = labels
        for p in paths:
            if p.startswith("labels."):
                k = p[len("labels.") :]
                if k in labels:
                    new[k] = labels[k]
                else:
                    new.pop(k, None)
            elif p != "labels":
                raise UsageError(f"cannot update field {p!r} of a snapshot: only labels")
        return records.set_labels(self.repo, key, new)

    def listing(self, keep: Callable[[Record], bool] = lambda r: True) -> list[Record]:
        return [r for r in records.every(self.repo) if r.phase != "removing" and keep(r)]

    def usage(self, key: str) -> tuple[int, int]:
        """(bytes, inodes) the snapshot alone holds: casfs's unique bytes of its volume
        (what removing it frees: a committed one's volume holds only its snapshot's
        tree), and its inode count."""
        rec = records.get(self.repo, records.check_key(key))
        unique = volume_figures(self.repo, rec.volume).unique
        if rec.kind == "committed" and rec.snapshot is not None:
            n = SnapshotNo(rec.snapshot)
            root = next(s.root for s in volumes.list_snapshots(self.repo, rec.volume) if s.n == n)
            return unique, tree_inodes(self.repo, BlobId(bytes.fromhex(root)))
        return unique, dir_inodes(self.mounts.path(rec.volume))

    # -- restarts ----------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Finish what a killed snapshotter left (by phase: records.py), then start the
        store mount if an active or view snapshot needs it and its daemon is not live."""
        done = []
        for rec in records.orphans(self.repo):
            try:
                if rec.phase == "preparing":
                    self._undo(rec)
                    done.append(f"snapshot {rec.key!r}: its interrupted prepare undone")
                elif rec.phase == "removing":
                    self._finish_remove(rec)
                    done.append(f"snapshot {rec.key!r}: its interrupted removal finished")
                else:  # committing: active again (containerd commits it again, or removes it)
                    records.settle(self.repo, rec.key)
                    done.append(f"snapshot {rec.key!r}: its interrupted commit undone")
            except CasfsError as e:  # (one snapshot's trouble keeps no other from being served)
                done.append(f"snapshot {rec.key!r}: not recovered: {e}")
        if any(rec.kind != "committed" for rec in records.every(self.repo)):
            try:
                self.mounts.ensure()
            except CasfsError as e:
                done.append(f"the store mount did not start: {e} (the next Mounts tries again)")
        return done


def tree_inodes(repo: Repository, root: BlobId) -> int:
    """The distinct inodes of a directory tree (its tree blobs read, no file's data)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        for entry in Tree.decode(repo.get_meta(todo.pop())).entries:
            seen.add(entry.attrs.ino)
            if entry.is_dir:
                todo.append(entry.blob)
    return len(seen) + 1  # (and the root)


def dir_inodes(path: str) -> int:
    """The distinct inodes under a mounted directory, as du counts them."""
    seen: set[int] = set()
    todo = [path]
    while todo:
        with os.scandir(todo.pop()) as it:
            for e in it:
                seen.add(e.inode())
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
    return len(seen) + 1


def chain_name(chain_id: str, parent: str) -> str:
    """The committed snapshot of a layer chain casfs holds, on `parent` (containerd
    looks it up by its label and parent; the name is ours)."""
    if not parent:
        return f"casfs-chain/{chain_id}"
    return f"casfs-chain/{chain_id}/{hashlib.sha256(parent.encode()).hexdigest()[:16]}"
