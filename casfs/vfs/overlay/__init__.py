"""A mounted read/write volume's overlay, in layers: nodes (inodes and listings),
writeback (state, buffers, flush and fold preparation), data (chunks, reads, writes),
namespace (copy-up and names, directory volumes only), fold (the worker side)."""
