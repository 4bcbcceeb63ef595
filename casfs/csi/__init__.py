"""The CSI plugin: `casfs csi serve`, kubelet's and the sidecars' gRPC peer on a unix socket.

A thin adapter, as the FUSE one is: each servicer decodes a request, calls casfs's
library (volumes, snapshots, the mount launcher) and answers; the server maps errors
through one table and logs one line per RPC.

    server.py        the grpc server (casfs.grpcsvc: the per-volume lock, logging, codes)
    identity.py      Identity: plugin info, capabilities, Probe
    controller.py    Controller: volumes and snapshots at rest
    node.py          Node: stage (casfs mount), publish (bind mounts, loop devices), stats
    codes.py         the error kinds it raises (casfs.grpcsvc.codes: the one table of codes)
    capabilities.py  which volume capabilities are served, and why others are not
    naming.py        volume and snapshot ids (the scheme, documented there)
    records.py       what CreateVolume asked, kept per volume beside the catalog
    figures.py       byte counts for the answers, behind one function
    health.py        a volume's condition
    plugin.py        what the servicers share: the store, the node, its mounts
    system.py        bind mounts and loop devices (mount, umount, losetup)
    proto/           csi.proto (the part of CSI v1 casfs serves) and its generated modules
"""
