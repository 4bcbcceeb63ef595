"""A read/write volume's write-back jobs (casfs.vfs.api.Job), one module each:

    flush.py        the overlay rows of every change, and the kind's files made durable
    sync.py         a block volume's written upper file alone, beside writes
    fold_dir.py     a directory volume's snapshot: the overlay into new tree blobs
    fold_block.py   a block volume's snapshot where it cannot freeze: into a new chunk map
    freeze.py       a block volume's O(1) snapshot: its written epoch frozen as it is
    frozen_fold.py  a frozen epoch folded into blobs in the background, beside writes
    puts.py         what the folds share: chunks stored by a pool of threads, the publish

Each holds what it captured (on the trio thread, lock held), run() (a worker thread: the
capture and the store, never the view) and apply()/abort() (the trio thread again).
"""
