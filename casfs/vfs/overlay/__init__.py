"""What a read/write volume's changes are made of, apart from the volume itself
(casfs.vfs.rw): nodes (inodes and listings, as rows), files (a directory volume's
upper files), spill (writes kept in memory), upper (a block volume's upper file of one
epoch), stack (the epochs over a block volume's base), behind (write-behind)."""
