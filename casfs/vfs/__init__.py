"""The filesystem logic under the FUSE adapter: views of trees, block maps and
read/write volumes, addressed by (view, inode number). Testable without a mount."""
