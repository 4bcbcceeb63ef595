"""The CSI plugin: `casfs csi serve`, kubelet's and the sidecars' gRPC peer on a unix socket.

proto/         csi.proto (the part of CSI v1 casfs serves) and its generated modules
"""
