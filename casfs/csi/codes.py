"""The CSI plugin's error kinds: casfs's gRPC table (casfs.grpcsvc.codes), shared with
the containerd snapshotter; the CSI spec's codes for each kind are listed there."""

from casfs.grpcsvc.codes import BadToken, InUse, NoRoom, OutOfRange, Pending, Unmet, message_of, status_of

__all__ = ["BadToken", "InUse", "NoRoom", "OutOfRange", "Pending", "Unmet", "message_of", "status_of"]
