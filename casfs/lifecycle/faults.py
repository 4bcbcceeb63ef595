"""Fault injection for crash tests: `CASFS_FAULT=<point>` makes the process kill itself
with SIGKILL when it reaches that point, as a power cut or the OOM killer would;
`CASFS_STOP=<point>` makes it stop itself (SIGSTOP) there, for a test to look at the
operation in progress and then let it go on (SIGCONT).

    import:after-claim     the image row is recorded (phase queued), nothing else done
    import:running         the import holds a job slot, phase importing
    import:after-stage     every blob is staged in STORE/tmp, none published
    import:after-publish   the blob files are published, their catalog rows not committed
    create:after-claim     a blank volume's row is recorded (phase creating)
    create:after-commit    a clone's one transaction committed, the catalog not closed
    snapshot:after-phase   phase snapshotting is recorded, the overlay not yet folded
    delete:after-phase     phase deleting is recorded, nothing released yet
    fold:before-publish    a block volume's fold stored its blobs, its snapshot not committed
    fold:after-publish     the fold's snapshot committed, its upper files not yet deleted
    gc:after-commit        a gc round's rows are deleted, its blobs not yet
    scrub:after-root       a scrub saved its progress after a root (resumes after it)
    import:after-commit    an import committed, its figures not yet counted (no row: pending)
    pull:batch             a pull stored a batch of arrived blobs, the snapshot not landed
    figures:counted        a settle counted figures, not yet written (refcount.accounts)
    snapshotter:prepared   a Prepare's volume is made, not yet mounted (phase preparing)
    snapshotter:committing a Commit unmounted and snapshotted, its records not yet swapped

`CASFS_SLOW_IMPORT_S=SECONDS` makes an import sleep that long once it runs (phase
importing, in its job slot): a slow import without a big source, for queue tests.

Unset (production), a point costs one environment lookup.
"""

from __future__ import annotations

import os
import time

ENV_FAULT = "CASFS_FAULT"
ENV_STOP = "CASFS_STOP"
ENV_SLOW_IMPORT = "CASFS_SLOW_IMPORT_S"


def fault_point(name: str) -> None:
    # (signal is imported only when a fault fires: its enums of every signal cost a
    # command's start-up a millisecond)
    if os.environ.get(ENV_FAULT) == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(ENV_STOP) == name:
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)


def slow_import() -> None:
    seconds = os.environ.get(ENV_SLOW_IMPORT)
    if seconds:
        time.sleep(float(seconds))
