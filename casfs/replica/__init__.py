"""Replicas: moving snapshots between stores, only the blobs the receiver lacks.

    wire.py       counted, hashed exact reads and writes; the blob record; verify()
    walk.py       the sender: the blobs under a root, parents first, held subtrees skipped
    assemble.py   the receiver: what is missing (no catalog row), blobs in, the landing commit
    land.py       what a received snapshot becomes here; divergence; provenance; store ids;
                  what a transfer did (Moved)
    stream.py     `casfs snapshot send` / `receive` (stream format 1)
    protocol.py   the frames of `pull`'s request/response protocol (both sides)
    serve.py      `casfs serve-replica`: the source's side of that protocol
    peers.py      SOURCE (a path or ssh://) and the connection to its serve-replica
    pull.py       `casfs pull SOURCE VOL`
    adopt.py      a pull through a shared bucket: blobs adopted where they are, not moved
    image.py      `casfs image pull SOURCE IMAGE`
    status.py     `volume info`'s replica lines and `volume rm --if-replicated`
    records.py    replicated volumes: the registry's records, and its rules as pure functions
    registry.py   those records in etcd: one-revision reads, compare-and-swap, leases
    active.py     taking and releasing `active` around a read/write mount, the catch-up pull
    agent.py      `casfs replica agent`: publish, follow, keep the factor (a reconcile loop)

Snapshot numbers and root ids are the origin's on every replica; see README.md
("Replicas") for the model and docs/developer-notes.md for the formats.
"""
