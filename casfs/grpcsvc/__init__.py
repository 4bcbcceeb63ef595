"""What casfs's gRPC services share (the CSI plugin, the containerd snapshotter): a
server on a unix socket, one log line per RPC, the per-key in-progress lock, errors
mapped through one table, and the check that the generated stubs are the .proto's.

    server.py   the socket, the adapter around a servicer (lock, error codes, logging)
    codes.py    casfs errors -> gRPC status codes, in one table
    regen.py    protoc (grpcio-tools) and mypy-protobuf over a package's .proto files
"""
