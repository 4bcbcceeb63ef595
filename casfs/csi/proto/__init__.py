"""csi.proto and the modules protoc makes of it (regen.py; checked in, tested to match)."""
