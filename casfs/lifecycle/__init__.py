"""Lifecycle: what keeps a store sane with crashes, retries and many callers at once.

    pids.py       is a process alive (zombies are not)
    faults.py     CASFS_FAULT=<point>: a process kills itself there (crash tests)
    config.py     store settings kept in the catalog's meta table (`casfs config`)
    queue.py      a cross-process limit on concurrent heavy jobs (job_slot)
    phases.py     the phases a row is in while work on it runs
    claims.py     who holds a volume read/write

Phases (the catalog's `phase` columns) are the source of truth; images.py and
volumes.py record them before the work starts, casfs.upkeep.recovery reads them after
a crash (and casfs.upkeep.ephemeral expires volumes): store-wide work, above the
volumes, so it lives on a floor above them.
"""
