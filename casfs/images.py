"""Images: immutable, verified content imported once from a raw file, a directory, a tar,
or an OCI image (`oci:DIR[:TAG]`, `docker-archive:FILE[:TAG]`: casfs.importers.oci).

Phases: queued -> importing -> verifying -> ready, or failed. The row is written
(phase queued, with the owner's pid) before any work, so a second caller sees the
import in progress (Busy) instead of re-entering it; the import then waits for a job
slot (casfs.lifecycle.queue) and records importing once it runs.

Failures, two kinds:
  * refused input (a casfs error: bad digest, hostile or corrupt archive, a missing
    source) and interruptions (Ctrl-C) remove the row: the store is left exactly as it
    was, as if the import had never been asked for;
  * anything else once the work started (an I/O error reading the source or writing
    the store, disk full, a bug) keeps the row as phase failed with the reason, so
    `image ls` shows what happened. A failed image holds no blob; importing the same
    name again replaces it, `image rm` removes it.
Either way the staged blobs are discarded. A process killed mid-import leaves its row
in an "-ing" phase for casfs.upkeep.recovery to remove.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs.catalog import images as rows
from casfs.catalog import transaction
from casfs.catalog import volumes as volume_rows
from casfs.catalog.images import ImageRow
from casfs.errors import Busy, CasfsError, Conflict, NotFound, UsageError
from casfs.ids import FIRST_FREE_INO
from casfs.kinds import VolumeKind, chunk_size_refusal
from casfs.lifecycle import pids
from casfs.lifecycle.faults import fault_point, slow_import
from casfs.lifecycle.phases import IMAGE_IN_PROGRESS, IMAGE_STEPS, ImagePhase, check_step
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.units import check_name

if TYPE_CHECKING:  # (imported where an import runs: hashlib is not every command's)
    from casfs.importers.oci.layers import LayerLimits
    from casfs.importers.oci.reference import Reference
    from casfs.store.verify import HashingReader

FORMATS = ("auto", "raw", "tar", "dir")

Progress = Callable[[int], None]


@dataclass
class ImageInfo:
    name: str
    kind: VolumeKind
    phase: ImagePhase
    size: int
    chunk_size: int
    source: str | None
    digest: str | None
    root: str | None
    created: float
    error: str | None = None
    owner_pid: int | None = None  # the process doing the current phase's work
    oci: dict[str, Any] | None = None  # an OCI image's digests and config (catalog.schema)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# A name that says tar is read as one, whatever the bytes: a damaged archive must be
# refused, not imported as a disk image. The compression the name promises, if any.
_TAR_NAMES = {
    ".tar": None,
    ".tar.gz": "gzip",
    ".tgz": "gzip",
    ".tar.zst": "zstd",
    ".tzst": "zstd",
    ".tar.bz2": "bzip2",
    ".tbz2": "bzip2",
    ".tbz": "bzip2",
    ".tar.xz": "xz",
    ".txz": "xz",
}


def _tar_name(source: Path) -> str | None:
    """The tar suffix the file's name ends with, if any."""
    name = source.name.lower()
    return next((suffix for suffix in _TAR_NAMES if name.endswith(suffix)), None)


def detect_format(source: Path) -> str:
    if source.is_dir():
        return "dir"
    with open(source, "rb") as f:
        head = f.read(512)
    if _tar_name(source) is not None or _compression(head) is not None:
        return "tar"
    # POSIX and GNU tar headers carry "ustar" at 257; pre-POSIX archives need --format tar.
    if head[257:262] == b"ustar":
        return "tar"
    return "raw"


def _compression(head: bytes) -> str | None:
    from casfs.importers.tarball import COMPRESSIONS

    return next((name for magic, name in COMPRESSIONS.items() if head.startswith(magic)), None)


def check_tar_name(source: Path) -> None:
    """A name that promises a compression must hold it: x.tar.gz of zlib bytes is refused."""
    suffix = _tar_name(source)
    if suffix is None or source.is_dir():
        return
    with open(source, "rb") as f:
        found = _compression(f.read(8))
    promised = _TAR_NAMES[suffix]
    if promised is not None and found != promised:
        what = f"{found} data" if found else f"not {promised} data"
        raise UsageError(
            f"{source.name} is named as a {promised}-compressed tar archive but is {what} "
            "(--format raw imports it as a disk image)"
        )


def _info(row: ImageRow) -> ImageInfo:
    root = row.root.hex() if row.root else None
    return ImageInfo(
        row.name,
        row.kind,
        ImagePhase(row.phase),
        row.size,
        row.chunk_size,
        row.source,
        row.digest,
        root,
        row.created,
        row.error,
        row.owner_pid,
        _json_loads(row.oci) if row.oci else None,
    )


def _json_loads(text: str) -> dict[str, Any]:
    import json  # (only for OCI images: a listing of others loads no json)

    loaded: dict[str, Any] = json.loads(text)
    return loaded


def list_images(repo: Repository, after: str | None = None, limit: int | None = None) -> list[ImageInfo]:
    return [_info(r) for r in rows.image_rows(repo.conn, after, limit)]


def _row(conn: sqlite3.Connection, name: str) -> ImageRow:
    row = rows.image_row(conn, name)
    if row is None:
        raise NotFound(f"no image named {name!r}")
    return row


def get_image(repo: Repository, name: str) -> ImageInfo:
    return _info(_row(repo.conn, name))


def import_image(
    repo: Repository,
    name: str,
    source: Path | str,
    expect: str | None = None,
    fmt: str = "auto",
    chunk_size: int | None = None,
    allow_devices: bool = False,
    progress: Progress | None = None,
    platform: str | None = None,
    on_stored: Callable[[int], None] | None = None,
) -> tuple[ImageInfo, bool]:
    """Import `source` as image `name`. Returns (info, created): created is False when
    an identical import already exists (a repeat is not an error). A source string
    `oci:…` or `docker-archive:…` is an OCI image (`platform` picks from an index).
    `on_stored(n)`: once committed, the bytes this import stored that the store did not
    hold (what the image alone holds, without reading its trees back as a usage does).
    `chunk_size` None: the default of the image's kind (VolumeKind.default_chunk_size)."""
    check_name(name, "image")
    if fmt not in FORMATS:
        raise UsageError(f"invalid format {fmt!r}: one of {', '.join(FORMATS)}")
    refusal = None if chunk_size is None else chunk_size_refusal(chunk_size)
    if refusal is not None:
        raise UsageError(refusal)
    import json

    from casfs.store.verify import parse_expect

    expected = parse_expect(expect) if expect else None
    if isinstance(source, str):
        from casfs.importers.oci.reference import is_reference

        if is_reference(source):
            if fmt != "auto":
                raise UsageError("--format does not apply to an oci: or docker-archive: source")
            from casfs.importers.oci.plan import parse_platform

            if platform is not None:
                parse_platform(platform)
            if expected is not None and expected[0] != "sha256":
                raise UsageError("--expect names an OCI image by its sha256 digest")
            return _oci_job(
                repo, name, source, expect, chunk_size, allow_devices, progress, platform, on_stored
            )
    if platform is not None:
        raise UsageError("--platform applies to an oci: or docker-archive: source")
    source = Path(source)
    if not source.exists() and not source.is_symlink():
        raise NotFound(f"source {source} does not exist")
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt == "tar":
        check_tar_name(source)
    if fmt == "dir" and expected:
        raise UsageError("--expect checks a file's bytes; a directory source has none to check")
    kind = VolumeKind.BLOCK if fmt == "raw" else VolumeKind.DIR
    given, chunk_size = chunk_size is not None, chunk_size or kind.default_chunk_size
    spec = json.dumps(
        {"source": str(source.resolve()), "format": fmt, "expect": expect, "chunk_size": chunk_size},
        sort_keys=True,
    )
    work = functools.partial(
        _do_import, repo, name, source, fmt, expected, chunk_size, allow_devices, progress, on_stored
    )
    return _run_import(repo, name, kind, spec, str(source), chunk_size, given, work)


def _run_import(
    repo: Repository,
    name: str,
    kind: VolumeKind,
    spec: str,
    source: str,
    chunk_size: int,
    chunk_given: bool,
    work: Callable[[], None],
) -> tuple[ImageInfo, bool]:
    """Claim the name, wait for a job slot, do the work; on failure, unclaim or fail."""
    from casfs.lifecycle.queue import job_slot  # (imports only: not a clone's or a listing's start-up)

    existing = _claim(repo, name, kind, spec, source, chunk_size, chunk_given)
    if existing is not None:
        return existing, False
    fault_point("import:after-claim")
    try:
        with job_slot(repo, f"import {name}"):
            _set_phase(repo, name, ImagePhase.QUEUED, ImagePhase.IMPORTING)
            fault_point("import:running")
            slow_import()
            work()
    except (CasfsError, KeyboardInterrupt, SystemExit):
        _unclaim(repo, name)
        raise
    except BaseException as e:
        _fail(repo, name, f"{type(e).__name__}: {e}")
        raise
    return get_image(repo, name), True


def _oci_job(
    repo: Repository,
    name: str,
    source: str,
    expect: str | None,
    chunk_size: int | None,
    allow_devices: bool,
    progress: Progress | None,
    platform: str | None,
    on_stored: Callable[[int], None] | None,
) -> tuple[ImageInfo, bool]:
    import json

    from casfs.importers.oci.reference import parse_reference

    given, chunk_size = chunk_size is not None, chunk_size or VolumeKind.DIR.default_chunk_size
    ref = parse_reference(source)
    request = {"source": str(ref), "format": ref.transport, "expect": expect, "chunk_size": chunk_size}
    spec = json.dumps({**request, "platform": platform, "allow_devices": allow_devices}, sort_keys=True)

    def work() -> None:
        _do_import_oci(repo, name, ref, expect, chunk_size, allow_devices, progress, platform, on_stored)

    return _run_import(repo, name, VolumeKind.DIR, spec, str(ref), chunk_size, given, work)


def _do_import_oci(
    repo: Repository,
    name: str,
    ref: Reference,
    expect: str | None,
    chunk_size: int,
    allow_devices: bool,
    progress: Progress | None,
    platform: str | None,
    on_stored: Callable[[int], None] | None,
) -> None:
    """Verify and apply the image's layers (casfs.importers.oci.importer), then commit
    the tree and what the image remembers in one transaction."""
    from casfs.importers.oci.importer import check_expect, import_oci, open_plan

    with open_plan(ref, platform) as plan, repo.batch() as batch:
        check_expect(plan, expect)

        def find_chain(chain_id: str) -> BlobId | None:
            return rows.chain_root(repo.conn, chain_id, chunk_size, allow_devices)

        limits = _layer_limits(repo)
        done = import_oci(batch, plan, chunk_size, allow_devices, find_chain, repo.get_meta, limits, progress)
        _set_phase(repo, name, ImagePhase.IMPORTING, ImagePhase.VERIFYING)
        built, meta = done.built, done.meta
        digest = plan.manifest_digest or plan.config_digest

        def finish(conn: sqlite3.Connection) -> None:
            import json

            oci = json.dumps(meta, sort_keys=True)
            if not rows.finish(conn, name, os.getpid(), built.root, built.size, built.next_ino, digest, oci):
                raise Busy(f"image {name!r} was taken over by another process during the import")
            rows.insert_chains(conn, name, done.chains)
            figures.new_subject(conn, f"image:{name}")
            if batch.shared or done.reused_layers:  # (a tree begun from another image's layers)
                figures.shared_unknown(conn)

        roots = Counter([built.root, *(root for _, _, root in done.chains)])
        batch.commit(roots, then=finish)
    _count(repo, name)
    if on_stored is not None:
        on_stored(batch.stored_bytes)


def _layer_limits(repo: Repository) -> LayerLimits:
    from casfs.importers.oci.layers import LayerLimits
    from casfs.lifecycle.config import effective

    entries = int(effective(repo.conn, "import.layer_entries").value)
    return LayerLimits(entries, int(effective(repo.conn, "import.layer_memory").value))


def _unclaim(repo: Repository, name: str) -> None:
    with transaction(repo.conn):
        rows.delete_unready(repo.conn, name, os.getpid())


def _fail(repo: Repository, name: str, reason: str) -> None:
    with transaction(repo.conn):
        rows.fail(repo.conn, name, os.getpid(), " ".join(reason.split()))


def _claim(
    repo: Repository, name: str, kind: VolumeKind, spec: str, source: str, chunk_size: int, chunk_given: bool
) -> ImageInfo | None:
    """Record the import (phase queued) before starting; or find it already done. An
    import that names no chunk size repeats one done with any (an older default's too)."""
    conn = repo.conn
    with transaction(conn):
        row = rows.image_row(conn, name)
        if row is not None:
            if row.phase == ImagePhase.READY:
                if _repeats(row.spec or "{}", spec, chunk_given):
                    return _info(row)
                raise Conflict(f"image {name!r} already exists with a different source or options")
            if row.phase in IMAGE_IN_PROGRESS and pids.alive(row.owner_pid):
                raise Busy(f"image {name!r} is being imported by process {row.owner_pid}")
            # failed, or left by a dead process: replaced (it holds no blob)
            rows.delete(conn, name)
        rows.insert_queued(conn, name, kind, chunk_size, source, spec, os.getpid())
    return None


def _repeats(done: str, spec: str, chunk_given: bool) -> bool:
    """Whether an import of `spec` repeats the one done with spec `done`."""
    if done == spec or chunk_given:
        return done == spec
    import json

    done_request, request = json.loads(done), json.loads(spec)
    done_request.pop("chunk_size", None)
    request.pop("chunk_size", None)
    return bool(done_request == request)


def _do_import(
    repo: Repository,
    name: str,
    source: Path,
    fmt: str,
    expected: tuple[str, str] | None,
    chunk_size: int,
    allow_devices: bool,
    progress: Progress | None,
    on_stored: Callable[[int], None] | None,
) -> None:
    from casfs.store.verify import HashingReader

    with repo.batch() as batch:
        reader: HashingReader | None = None
        if fmt == "dir":
            from casfs.importers.dirtree import import_dir

            built = import_dir(batch, source, chunk_size, progress)
            root, size, next_ino = built.root, built.size, built.next_ino
        else:
            with open(source, "rb") as raw:
                reader = HashingReader(raw, sha256=expected is not None and expected[0] == "sha256")
                if fmt == "raw":
                    from casfs.importers.raw import import_raw

                    root, size = import_raw(batch, reader, chunk_size, progress)
                    next_ino = FIRST_FREE_INO  # a disk has no inodes
                else:
                    from casfs.importers.tarball import import_tar

                    built = import_tar(batch, reader, chunk_size, allow_devices, progress)
                    root, size, next_ino = built.root, built.size, built.next_ino
                reader.drain()
            _set_phase(repo, name, ImagePhase.IMPORTING, ImagePhase.VERIFYING)
            reader.check(expected)
        digest = f"blake3:{reader.digests()['blake3']}" if reader else None

        def finish(conn: sqlite3.Connection) -> None:
            done = rows.finish(conn, name, os.getpid(), root, size, next_ino, digest)
            if not done:  # rolls the commit back: the published files become orphans for gc
                raise Busy(f"image {name!r} was taken over by another process during the import")
            figures.new_subject(conn, f"image:{name}")
            if batch.shared:
                figures.shared_unknown(conn)

        fault_point("import:after-stage")
        # Batch.commit publishes too (publishing is idempotent); done here first so that a
        # crash test can stop between the files and the rows (recovery sweeps the orphans).
        batch.staging.publish()
        fault_point("import:after-publish")
        batch.commit({root: 1}, then=finish)
    _count(repo, name)
    if on_stored is not None:
        on_stored(batch.stored_bytes)


def _count(repo: Repository, name: str) -> None:
    """The new image's figures, counted in full: an import reads all its data anyway."""
    from casfs.refcount.accounts import settle

    fault_point("import:after-commit")
    settle(repo, [f"image:{name}"], budget=None)


def _set_phase(repo: Repository, name: str, old: ImagePhase, new: ImagePhase) -> None:
    check_step(IMAGE_STEPS, old, new)
    with transaction(repo.conn):
        rows.set_phase(repo.conn, name, new)


def image_users(conn: sqlite3.Connection, name: str) -> list[str]:
    return volume_rows.made_from(conn, f"image:{name}")


def remove_image(repo: Repository, name: str, if_exists: bool = False) -> bool:
    """Delete an image; refused while a volume was made from it. Frees nothing itself:
    its root loses one reference, and gc frees what no longer has any."""
    conn = repo.conn
    with transaction(conn):
        row = rows.image_row(conn, name)
        if row is None:
            if if_exists:
                return False
            raise NotFound(f"no image named {name!r}")
        if row.phase in IMAGE_IN_PROGRESS and pids.alive(row.owner_pid):
            raise Busy(f"image {name!r} is being imported by process {row.owner_pid}")
        users = image_users(conn, name)
        if users:
            raise Busy(f"image {name!r} is in use by volume(s): {', '.join(users)}")
        if row.root is not None:
            held = [row.root, *rows.chain_roots(conn, name)]
            ledger.release(conn, held)
        rows.delete(conn, name)
        if row.root is not None:
            figures.image_removed(conn, name, held)
    return True


def ready_image(conn: sqlite3.Connection, name: str) -> ImageRow:
    """The row of a ready image (Busy if it is not ready), with its root set."""
    return rows.ready_image_row(conn, name)


def image_root(repo: Repository, name: str) -> tuple[BlobId, VolumeKind, int]:
    row = ready_image(repo.conn, name)
    assert row.root is not None
    return row.root, row.kind, row.chunk_size


def export_root(
    repo: Repository, kind: VolumeKind, root: BlobId, chunk_size: int, dest: Path, fmt: str = "auto"
) -> str:
    """Write content out: a block root as a raw file; a tree as a directory or a tar."""
    from casfs import exporters

    if kind == VolumeKind.BLOCK:
        if fmt not in ("auto", "raw"):
            raise UsageError("a block image exports only as a raw file")
        exporters.export_raw(repo.get, root, dest)
        return "raw"
    if fmt == "auto":
        fmt = "tar" if dest.name.endswith((".tar", ".tar.gz", ".tgz", ".tar.zst")) else "dir"
    if fmt == "tar":
        exporters.export_tar(repo.get, root, chunk_size, dest)
    elif fmt == "dir":
        exporters.export_dir(repo.get, root, chunk_size, dest)
    else:
        raise UsageError(f"a directory image exports as 'dir' or 'tar', not {fmt!r}")
    return fmt


def export_image(repo: Repository, name: str, dest: Path, fmt: str = "auto") -> str:
    root, kind, chunk_size = image_root(repo, name)
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise Conflict(f"{dest} already exists")
    return export_root(repo, kind, root, chunk_size, dest, fmt)
