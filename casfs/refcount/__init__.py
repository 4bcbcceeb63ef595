"""Refcounts: the increment/decrement ledger, gc and the fsck recount."""
