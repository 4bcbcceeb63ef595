"""Lifecycle: what keeps a store sane with crashes, retries and many callers at once.

    pids.py       is a process alive (zombies are not)
    faults.py     CASFS_FAULT=<point>: a process kills itself there (crash tests)
    config.py     store settings kept in the catalog's meta table (`casfs config`)
    queue.py      a cross-process limit on concurrent heavy jobs (job_slot)
    recovery.py   at start-up, roll back or finish what dead processes left half done
    ephemeral.py  volumes with a grace period, removed by gc once unused for longer

Phases (the catalog's `phase` columns) are the source of truth; images.py and
volumes.py record them before the work starts, recovery.py reads them after a crash.
"""
