"""A mounted read/write volume: the core (volume.py: state, claim, guard, counters)
holding its kind (kind.py: the protocol; dirkind.py with names.py, or blockkind.py),
and its write-back jobs (jobs/). Synchronous and trio-free: tests drive it without a
mount, the FUSE adapter through casfs.vfs.api.RwView."""
