"""The containerd snapshotter: `casfs snapshotter serve`, a proxy plugin of containerd
(containerd.services.snapshots.v1.Snapshots on a unix socket) whose snapshots are casfs
volumes and their snapshots, so that containers run on casfs root filesystems.

    service.py    the snapshotter model over casfs volumes (no gRPC): prepare, commit, ...
    records.py    the snapshots' catalog rows and their phases (the locks, the recovery)
    mounts.py     one whole-store `casfs mount` serving every active and view snapshot;
                  the runtime binds its volumes/VOLUME
    filters.py    List's filters (containerd's syntax: labels."x"==y, parent==P, kind==K)
    servicer.py   the gRPC adapter: requests in, Info and Mount out
    server.py     the server: recovery at start, the socket, the per-key lock
    proto/        snapshots.proto and mount.proto (containerd's API, the part served)
"""
