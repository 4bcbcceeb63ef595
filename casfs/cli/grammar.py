"""The grammar: one table row per command (noun, verb, function, help, arguments).

The grammar is a contract (DESIGN.md, "The command line"): scripts and orchestrators
depend on it. Two parsers read it: parser.py makes the argparse parser (help, errors,
every form argparse takes), and quick.py parses the plain command lines that make up
nearly every call without importing argparse. Neither imports a command's module: a
row names its function through a `_Module`, so only the module of the command that
runs is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

    Command = Callable[[argparse.Namespace], int]


class _Module:
    """A command module by name: `volumes.cmd_create` is a command that imports
    casfs.cli.volumes when it runs. (The grammar names every command; importing each
    one's module, and what those import, would cost every command's start-up.)"""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, func: str) -> Command:
        if func.startswith("__"):  # (copy, pickle and friends probe for these: not commands)
            raise AttributeError(func)
        return LazyCommand(self.name, func)


class LazyCommand:
    """`module.func(args)`, the module imported at the call."""

    __slots__ = ("func", "module")

    def __init__(self, module: str, func: str) -> None:
        self.module, self.func = module, func

    def resolve(self) -> Command:
        import importlib

        command: Command = getattr(importlib.import_module(self.module), self.func)
        return command

    def __call__(self, args: argparse.Namespace) -> int:
        return self.resolve()(args)


bundle = _Module("casfs.cli.bundle")
csi = _Module("casfs.cli.csi")
fetch = _Module("casfs.cli.fetch")
images = _Module("casfs.cli.images")
maintenance = _Module("casfs.cli.maintenance")
mounts = _Module("casfs.cli.mounts")
replica = _Module("casfs.cli.replica")
replicas = _Module("casfs.cli.replicas")
scrubbing = _Module("casfs.cli.scrub")
snapshotter = _Module("casfs.cli.snapshotter")
store_status = _Module("casfs.cli.status")
snapshots = _Module("casfs.cli.snapshots")
volumes = _Module("casfs.cli.volumes")


class Arg:
    """One `add_argument` call."""

    __slots__ = ("flags", "options")

    def __init__(self, *flags: str, **options: Any) -> None:
        self.flags, self.options = flags, options


class OneOf:
    """Mutually exclusive arguments, one of them required."""

    __slots__ = ("args",)

    def __init__(self, *args: Arg) -> None:
        self.args = args


class Row:
    """A command: `casfs NOUN VERB`, or `casfs NOUN` when verb is None."""

    __slots__ = ("args", "description", "func", "help", "noun", "verb")

    def __init__(
        self,
        noun: str,
        verb: str | None,
        func: Command,
        help: str,
        args: Sequence[Arg | OneOf] = (),
        description: str | None = None,
    ) -> None:
        self.noun, self.verb, self.func, self.help = noun, verb, func, help
        self.args, self.description = args, description


# The help of the nouns that take verbs.
NOUNS = {
    "image": "immutable, verified content: raw disk images and directory trees",
    "volume": "named, mountable, copy-on-write volumes",
    "snapshot": "immutable, numbered states of a volume",
    "queue": "the store's bounded work queue (imports, snapshot folds, fsck, gc)",
    "config": "store settings, kept in the catalog",
    "csi": "the Kubernetes CSI plugin",
    "snapshotter": "the containerd snapshotter (containers' root filesystems)",
    "replica": "replicated volumes: K copies on other nodes, coordinated through etcd",
}

NAME = Arg("name", metavar="NAME")


def log_level(key: str) -> Arg:
    """A gRPC server's --log-level (`key`: what each RPC's log line names)."""
    return Arg(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help=f"info logs one line per RPC: method, {key}, code, milliseconds",
    )


JSON_LIST = Arg("--json", action="store_true", help="print one JSON list")
JSON_OBJECT = Arg("--json", action="store_true", help="print one JSON object")
LIMIT = Arg("--limit", metavar="N", help="at most N entries (an integer >= 1)")
AFTER = Arg("--after", metavar="NAME", help="only names sorting after NAME (a cursor: it need not exist)")
AFTER_N = Arg("--after", metavar="N", help="only snapshots numbered above N (it need not exist)")
PAGING = (
    "Entries come sorted; --limit N and --after LAST page through them (the next page\n"
    "starts after the last name printed). A figure marked ~ (listed in --json's pending)\n"
    "is an estimate until counted: `casfs gc` or `casfs fsck --repair` count them all."
)
REGISTRY = Arg(
    "--registry",
    metavar="etcd://HOST:PORT[,HOST:PORT]/PREFIX",
    help="the replica registry (default: $CASFS_REGISTRY)",
)
NODE = Arg(
    "--node", metavar="N", help="this node's name in the registry (default: $CASFS_NODE, else the hostname)"
)
REMOTE = Arg(
    "--remote-casfs",
    metavar="CMD",
    help="the casfs command on an ssh source (default: $CASFS_REMOTE, else casfs)",
)
DEST = Arg("dest", metavar="DEST", help="must not exist (or be an empty directory)")
EXPORT_FORMAT = Arg("--format", choices=("auto", "raw", "dir", "tar"), default="auto")

GRAMMAR = (
    Row(
        "init",
        None,
        maintenance.cmd_init,
        "create a store at --store (an existing store is left as it is)",
        [
            Arg("--blobs", metavar="s3://BUCKET[/PREFIX]", help="keep blobs in a bucket (AWS_* settings)"),
            Arg("--blob-cache", metavar="SIZE", help="with --blobs: cache of fetched blobs (4G)"),
        ],
        "Create a store. With --blobs, its catalog is local and its blobs are in the bucket,\n"
        "reached with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws).",
    ),
    Row(
        "image",
        "fetch",
        fetch.cmd_fetch,
        "read all of an image once, verified (fills the local cache of a store on S3)",
        [NAME],
    ),
    Row(
        "image",
        "import",
        images.cmd_import,
        "import a raw disk image, a directory, a tar archive or an OCI image",
        [
            NAME,
            Arg(
                "source",
                metavar="SOURCE",
                help="a raw file, a directory, a tar (.tar, .tar.gz, .tar.zst), or an OCI image: "
                "oci:LAYOUT_DIR[:TAG] or docker-archive:FILE[:TAG]",
            ),
            Arg(
                "--expect",
                metavar="ALGO:HEX",
                help="sha256:HEX or blake3:HEX the source must match (an OCI image: its manifest's "
                "sha256, or the index its tag names; a docker-archive: its image id)",
            ),
            Arg(
                "--platform",
                metavar="OS/ARCH[/VARIANT]",
                help="the manifest to pick from an OCI image index (default: linux/amd64)",
            ),
            Arg(
                "--format",
                choices=("auto", "raw", "tar", "dir"),
                default="auto",
                help="how to read SOURCE (default: detected)",
            ),
            Arg(
                "--chunk-size",
                metavar="SIZE",
                help="chunk size, a power of two from 4K to 4M (default: 32K for a disk, 64K for a tree)",
            ),
            Arg("--allow-devices", action="store_true", help="keep device nodes found in a tar archive"),
        ],
        "Import SOURCE as image NAME. Nothing is stored unless all of it was read and, with\n"
        "--expect, its digest matched. Repeating an identical import succeeds and does nothing.\n"
        "An OCI image has every blob checked against its digest and each layer's content\n"
        "against its diff_id, and its layers applied in order (whiteouts, opaque directories).",
    ),
    Row(
        "image",
        "ls",
        images.cmd_ls,
        "list images with their logical, stored and unique bytes",
        [JSON_LIST, LIMIT, AFTER],
        PAGING,
    ),
    Row("image", "info", images.cmd_info, "show one image", [NAME, JSON_OBJECT]),
    Row(
        "image",
        "rm",
        images.cmd_rm,
        "delete an image (refused while a volume was made from it)",
        [NAME, Arg("--if-exists", action="store_true", help="succeed when there is no such image")],
        "Delete an image. Its blobs are freed by the next `casfs gc`, unless shared.",
    ),
    Row(
        "image",
        "pull",
        replica.cmd_image_pull,
        "bring an image of another store here",
        [
            Arg("source", metavar="SOURCE", help="a store's path, or ssh://[USER@]HOST[:PORT]/STORE"),
            Arg("image", metavar="IMAGE"),
            Arg("--as", dest="as_name", metavar="NAME", help="the local image's name (default: IMAGE)"),
            Arg(
                "--remote-casfs",
                metavar="CMD",
                help="the casfs command on an ssh source (default: $CASFS_REMOTE, else casfs)",
            ),
            JSON_OBJECT,
        ],
        "Fetch image IMAGE of SOURCE (its root, size and digests), moving only the blobs this\n"
        "store lacks. When both stores keep their blobs in one bucket (two prefixes), the\n"
        "blobs are adopted where they are: only catalog records move (docs/s3.md).",
    ),
    Row(
        "image",
        "export",
        images.cmd_export,
        "write an image out: a raw file, a directory or a tar",
        [
            NAME,
            DEST,
            Arg(
                "--format",
                choices=("auto", "raw", "dir", "tar"),
                default="auto",
                help="default: raw for block images; tar when DEST ends in .tar…, else dir",
            ),
        ],
    ),
    Row(
        "volume",
        "create",
        volumes.cmd_create,
        "create a volume from an image, a snapshot or blank space",
        [
            NAME,
            OneOf(
                Arg(
                    "--from",
                    dest="source",
                    metavar="IMAGE|VOL@N",
                    help="an image, or snapshot N of volume VOL",
                ),
                Arg("--blank-dir", action="store_true", help="an empty directory volume"),
                Arg("--blank-block", metavar="SIZE", help="a block volume of SIZE zero bytes (e.g. 10G)"),
            ),
            Arg("--ro", action="store_true", help="read-only"),
            Arg(
                "--grace",
                metavar="DURATION",
                help="ephemeral: `casfs gc` removes the volume once it has not been mounted for this long "
                "(e.g. 30s, 10m, 2h, 7d)",
            ),
        ],
        "Create volume NAME. A clone of an image or a snapshot costs the same whatever its size.\n"
        "Repeating an identical create succeeds; a different spec for an existing name exits 4.",
    ),
    Row(
        "volume",
        "ls",
        volumes.cmd_ls,
        "list volumes with their logical, stored, written and unique bytes",
        [JSON_LIST, LIMIT, AFTER],
        PAGING,
    ),
    Row("volume", "info", volumes.cmd_info, "show one volume", [NAME, JSON_OBJECT]),
    Row(
        "volume",
        "rm",
        volumes.cmd_rm,
        "delete a volume and its snapshots",
        [
            NAME,
            Arg("--if-exists", action="store_true", help="succeed when there is no such volume"),
            Arg(
                "--if-replicated",
                metavar="K",
                help="only if K known peers hold, asked now, a snapshot at least as new as the newest here",
            ),
        ],
        "Delete a volume and its snapshots (refused while mounted, or while another volume\n"
        "was made from one of its snapshots). Blobs are freed by the next `casfs gc`.\n"
        "With --if-replicated K, each peer `casfs pull` recorded is asked through its SOURCE\n"
        "(ssh runs $CASFS_SSH and $CASFS_REMOTE there); fewer than K holding a snapshot as\n"
        "new as this store's newest (the same one, where they hold its number) exits 4.",
    ),
    Row(
        "volume",
        "resize",
        volumes.cmd_resize,
        "set a block volume's size (not while mounted read/write)",
        [
            NAME,
            Arg("size", metavar="SIZE", help="the new size, e.g. 20G"),
            Arg("--allow-shrink", action="store_true", help="allow dropping the end of the disk"),
        ],
        "Grow a block volume (the new space reads as zeros) or, with --allow-shrink, cut it.\n"
        "A write never resizes a block volume: this is the only way.",
    ),
    Row(
        "volume",
        "export",
        volumes.cmd_export,
        "write a volume's base out: a raw file, a directory or a tar",
        [NAME, DEST, EXPORT_FORMAT],
        "Write out the volume's base: its state at the last snapshot or unmount (changes\n"
        "not yet folded by a mounted read/write daemon are not included).",
    ),
    Row(
        "volume",
        "bundle",
        bundle.cmd_bundle,
        "write an OCI runtime bundle (config.json) for a volume made from an OCI image",
        [
            NAME,
            Arg("dir", metavar="DIR", help="the bundle directory (made if absent)"),
            Arg(
                "--rootfs",
                metavar="PATH",
                help="where the volume is mounted already (default: mount it at DIR/rootfs)",
            ),
        ],
        "Mount volume NAME at DIR/rootfs (unless --rootfs says where it is mounted) and write\n"
        "DIR/config.json: the image's entrypoint + cmd, env, working dir and user, root.path the\n"
        "mount. Then `runc run -b DIR ID`; `casfs umount DIR/rootfs` once the container is gone.",
    ),
    Row(
        "snapshot",
        "create",
        snapshots.cmd_create,
        "snapshot a volume at rest; prints the snapshot's number",
        [Arg("volume", metavar="VOL"), Arg("--label", metavar="L", help="a free-form label")],
    ),
    Row(
        "snapshot",
        "ls",
        snapshots.cmd_ls,
        "list a volume's snapshots",
        [Arg("volume", metavar="VOL"), JSON_LIST, LIMIT, AFTER_N],
        PAGING,
    ),
    Row(
        "snapshot",
        "rm",
        snapshots.cmd_rm,
        "delete snapshot N of volume VOL (refused while a volume uses it)",
        [
            Arg("ref", metavar="VOL@N"),
            Arg("--if-exists", action="store_true", help="succeed when there is no such snapshot"),
        ],
    ),
    Row(
        "snapshot",
        "prune",
        snapshots.cmd_prune,
        "remove the snapshots of VOL a retention policy does not keep",
        [
            Arg("volume", metavar="VOL"),
            Arg("--keep-last", metavar="N", help="keep the N newest snapshots"),
            Arg("--keep-hourly", metavar="H", help="keep the newest of each of the last H hours with one"),
            Arg("--keep-daily", metavar="D", help="keep the newest of each of the last D days with one"),
            Arg("--dry-run", action="store_true", help="print what would go; remove nothing"),
            JSON_OBJECT,
        ],
        "Keep what any rule keeps (restic's `forget` rules; hours and days in UTC), remove\n"
        "the rest: at least one rule is required. The newest snapshot and those a volume is\n"
        "made from always stay. A removed snapshot leaves a bookmark (its number and root),\n"
        "so replicas still pull incrementally and a diverged line is still refused.",
    ),
    Row(
        "snapshot",
        "export",
        snapshots.cmd_export,
        "write a snapshot out: a raw file, a directory or a tar",
        [Arg("ref", metavar="VOL@N"), DEST, EXPORT_FORMAT],
    ),
    Row(
        "snapshot",
        "send",
        replica.cmd_send,
        "write a snapshot as a stream to stdout (for `casfs snapshot receive`)",
        [
            Arg("ref", metavar="VOL@N"),
            Arg("--since", metavar="VOL@M", help="only what snapshot M of the same volume lacks"),
        ],
        "Write snapshot N of VOL to stdout as a self-describing stream: every blob with its id,\n"
        "a trailer with counts and a hash. With --since, only blobs not in VOL@M: the receiver\n"
        "must hold VOL@M. E.g. `casfs snapshot send vm1@7 | ssh host casfs snapshot receive`.",
    ),
    Row(
        "snapshot",
        "receive",
        replica.cmd_receive,
        "read a snapshot stream from stdin and add the snapshot here",
        [
            Arg(
                "--as", dest="as_name", metavar="NAME", help="the local volume's name (default: the sender's)"
            ),
            JSON_OBJECT,
        ],
        "Read a stream of `casfs snapshot send` from stdin. Every blob is verified on arrival\n"
        "(exit 5 if one is damaged); the snapshot appears in one transaction once the whole\n"
        "stream checked out, with the sender's number and root. Receiving a snapshot held\n"
        "already does nothing (exit 0); one that diverges from the local line exits 4.",
    ),
    Row(
        "rollback",
        None,
        volumes.cmd_rollback,
        "make snapshot N the current state of volume VOL",
        [Arg("volume", metavar="VOL"), Arg("n", metavar="N")],
        "Make snapshot N the volume's state again (the volume must not be mounted read/write).\n"
        "Later snapshots are kept.",
    ),
    Row(
        "pull",
        None,
        replica.cmd_pull,
        "bring a volume's local replica up to a snapshot of another store",
        [
            Arg("source", metavar="SOURCE", help="a store's path, or ssh://[USER@]HOST[:PORT]/STORE"),
            Arg("volume", metavar="VOL"),
            Arg("--snapshot", metavar="N", help="this snapshot (default: the source's newest)"),
            Arg("--as", dest="as_name", metavar="NAME", help="the local volume's name (default: VOL)"),
            Arg(
                "--remote-casfs",
                metavar="CMD",
                help="the casfs command on an ssh source (default: $CASFS_REMOTE, else casfs)",
            ),
            Arg("--bwlimit", metavar="RATE", help="read at most RATE bytes per second (50M: 50 MiB/s)"),
            JSON_OBJECT,
        ],
        "Fetch snapshot N (default: the newest) of VOL from SOURCE, moving only the blobs this\n"
        "store lacks, and add it here with the same number and root. Interrupted, a rerun\n"
        "fetches only what is still missing. Refused (exit 4) when the two stores' lines have\n"
        "diverged; --as NAME keeps the other line as a new volume. ssh runs $CASFS_SSH\n"
        "(default: ssh); its connection and a server on the source stay up for the next pull\n"
        "for $CASFS_SSH_PERSIST seconds (default 60; 0: not). When both stores keep their\n"
        "blobs in one bucket (two prefixes), the blobs are adopted where they are: only\n"
        "catalog records move (docs/s3.md).",
    ),
    Row(
        "serve-replica",
        None,
        replica.cmd_serve,
        "(used by pull) answer a pull's requests on stdin and stdout",
        [
            Arg("path", metavar="STORE"),
            Arg("--listen", metavar="NAME", help="serve on a socket in the background (repeated pulls)"),
            Arg("--idle", metavar="SECONDS", type=float, default=60.0, help="with --listen: exit when idle"),
            Arg(
                "--stdio",
                action="store_true",
                help="with --listen: then serve this session on stdin and stdout too",
            ),
        ],
    ),
    Row(
        "mount",
        None,
        mounts.cmd_mount,
        "mount the store, or one volume, with FUSE",
        [
            Arg("mountpoint", metavar="MOUNTPOINT"),
            Arg("--volume", metavar="NAME", help="mount this volume alone"),
            Arg("--ro", action="store_true", help="mount read-only"),
            Arg("--allow-other", action="store_true", help="let other users access the mount"),
            Arg(
                "--suid",
                action="store_true",
                help="setuid bits and file capabilities take effect at exec (FUSE mounts are nosuid)",
            ),
            Arg("--foreground", action="store_true", help="stay in the foreground"),
            Arg(
                "--no-passthrough",
                action="store_true",
                help="serve every read through the daemon, re-hashed (no kernel passthrough)",
            ),
            Arg("--metrics", metavar="ADDR:PORT", help="serve Prometheus metrics there (:9101: loopback)"),
            REGISTRY,
            NODE,
            REMOTE,
            Arg(
                "--snapshot-every",
                metavar="DURATION",
                help="replicated: the node's agent snapshots the mount this often (5m); the others follow",
            ),
        ],
        "Mount the whole store (images/, volumes/, snapshots/) at MOUNTPOINT, or with --volume\n"
        "one volume: its root directory, or a regular file for a block volume.\n"
        "A read-only mount (--ro) hands files of images and snapshots up to 64 MiB to the\n"
        "kernel (FUSE passthrough), from verified copies in STORE/cache/files/; getfattr -n\n"
        "user.casfs.passthrough MOUNTPOINT says whether it is on, or why not.\n"
        "A read/write mount of a replicated volume (a registry given or in $CASFS_REGISTRY)\n"
        "takes `active` for this node first (exit 4 naming the holder while its lease\n"
        "lives), and pulls the newest snapshot when this store is behind.",
    ),
    Row(
        "umount",
        None,
        mounts.cmd_umount,
        "unmount a casfs mount",
        [Arg("mountpoint", metavar="MOUNTPOINT"), REGISTRY, NODE],
        "Unmount (a changed volume gets a snapshot). A replicated volume's snapshot is then\n"
        "published in the registry and `active` released: the other replicas pull it.",
    ),
    Row(
        "replica",
        "ls",
        replicas.cmd_ls,
        "each replica of the replicated volumes: node, snapshot, lag, active, healthy, last seen",
        [
            Arg("volume", metavar="VOL", nargs="?"),
            REGISTRY,
            Arg("--json", action="store_true", help="print JSON"),
        ],
    ),
    Row(
        "replica",
        "set-factor",
        replicas.cmd_set_factor,
        "keep K replicas of VOL (the first call makes VOL replicated, from this store's copy)",
        [
            Arg("volume", metavar="VOL"),
            Arg("k", metavar="K"),
            Arg("--keep-last", metavar="N", help="retention: keep the newest N snapshots"),
            Arg("--keep-hourly", metavar="H", help="retention: and the newest of each of the last H hours"),
            Arg("--keep-daily", metavar="D", help="retention: and the newest of each of the last D days"),
            REGISTRY,
        ],
        "The first call records VOL (its kind and origin, from this store) with factor K;\n"
        "later ones change K. --keep-* set the retention the active node's agent applies\n"
        "(`casfs snapshot prune`'s rules).",
    ),
    Row(
        "replica",
        "add",
        replicas.cmd_add,
        "want a replica of VOL on node N (its agent pulls it)",
        [Arg("volume", metavar="VOL"), Arg("--node", metavar="N", required=True), REGISTRY],
    ),
    Row(
        "replica",
        "rm",
        replicas.cmd_rm,
        "remove node N's replica of VOL, only if K other healthy replicas remain",
        [Arg("volume", metavar="VOL"), NODE, REGISTRY],
        "Refused (exit 4) unless the factor K of other replicas are alive and hold a snapshot\n"
        "at least as new as the newest, checked again once the entry is out of the count;\n"
        "the last good copy is never removed. The node's agent then deletes its copy.",
    ),
    Row(
        "replica",
        "sync",
        replicas.cmd_sync,
        "pull VOL's newest snapshot into this store from whichever replica holds it",
        [Arg("volume", metavar="VOL"), NODE, REMOTE, REGISTRY],
    ),
    Row(
        "replica",
        "agent",
        replicas.cmd_agent,
        "the node's replica agent: publish, follow, keep the factor (runs until stopped)",
        [
            NODE,
            Arg("--reach", metavar="URL", help="how the other nodes reach this store: ssh://… or a path"),
            Arg("--bwlimit", metavar="RATE", help="pull at most RATE bytes a second (50M)"),
            REMOTE,
            REGISTRY,
        ],
        "Publish an entry for every local replica of a replicated volume, keep this node\n"
        "alive on an etcd lease, pull newer snapshots from the others, and create a missing\n"
        "replica when this node is the one the rule names (fewest replicas, then most free\n"
        "space). Retries while etcd is down; decides nothing on a stale read.",
    ),
    Row(
        "fsck",
        None,
        maintenance.cmd_fsck,
        "recount references and re-hash blobs; exit 5 if problems remain",
        [
            Arg("--repair", action="store_true", help="fix counts, remove orphans and dead rows"),
            Arg(
                "--heal-from",
                metavar="SOURCE",
                help="with --repair: fetch missing and corrupt blobs from this store",
            ),
            Arg(
                "--sample",
                metavar="FRACTION",
                default="1.0",
                help="re-hash this fraction of data blobs (default 1.0: all); metadata is always read",
            ),
            Arg("--json", action="store_true", help="print the report as one JSON object"),
        ],
        "Walk every root, recount every reference and re-hash blobs. Exits 0 when clean (or\n"
        "everything found was repaired), 5 when problems remain.",
    ),
    Row(
        "status",
        None,
        store_status.cmd_status,
        "the store and its running mounts at a glance",
        [Arg("--json", action="store_true", help="print one JSON object")],
        "What the store holds, damage recorded, the work queue, the last scheduled scrub, and\n"
        "each running mount (with its figures when it serves --metrics).",
    ),
    Row(
        "scrub",
        None,
        scrubbing.cmd_scrub,
        "re-hash every blob in use, name what holds each damaged one; exit 5 if any remain",
        [
            Arg("--volume", metavar="NAME", help="only this volume (its base and snapshots)"),
            Arg("--image", metavar="NAME", help="only this image"),
            Arg("--rate", metavar="SIZE", help="read at most SIZE a second (100M)"),
            Arg("--heal-from", metavar="SOURCE", help="fetch good copies from this store (a path or ssh://)"),
            Arg(
                "--heal-from-peers",
                action="store_true",
                help="fetch good copies from every store this one has pulled from, in turn",
            ),
            Arg("--json", action="store_true", help="print the report as one JSON object"),
        ],
        "Read and re-hash every blob reachable from images, volumes and snapshots (safe while\n"
        "mounted). Each damaged or missing blob is reported with the image, volume or\n"
        "snapshot, file and byte range that hold it; --heal-from stores good copies from\n"
        "another store. An interrupted scrub resumes where it stopped.",
    ),
    Row(
        "gc",
        None,
        maintenance.cmd_gc,
        "free blobs nothing references any more",
        [
            Arg("--json", action="store_true", help="print the report as one JSON object"),
            Arg(
                "--repack-below",
                metavar="FRACTION",
                type=float,
                default=0.5,
                help="store on S3: rewrite packs whose live bytes are under FRACTION (default 0.5)",
            ),
        ],
        "Remove ephemeral volumes unused for longer than their grace period, then free every\n"
        "blob nothing references any more.",
    ),
    Row(
        "queue",
        "ls",
        maintenance.cmd_queue_ls,
        "list running and waiting jobs of every process on the store",
        [JSON_OBJECT],
    ),
    Row(
        "config",
        "ls",
        maintenance.cmd_config_ls,
        "list settings with their values and where each comes from",
        [JSON_LIST],
    ),
    Row(
        "config",
        "get",
        maintenance.cmd_config_get,
        "print a setting's value (the environment overrides the store)",
        [Arg("key", metavar="KEY", help="e.g. queue.limit"), JSON_OBJECT],
    ),
    Row(
        "config",
        "set",
        maintenance.cmd_config_set,
        "store a setting, e.g. `casfs config set queue.limit 4`",
        [Arg("key", metavar="KEY"), Arg("value", metavar="VALUE")],
    ),
    Row(
        "csi",
        "serve",
        csi.cmd_serve,
        "serve the CSI plugin (identity, controller, node) on a unix socket",
        [
            Arg("--endpoint", metavar="unix:///PATH", help="the socket to listen on (required)"),
            Arg("--node-id", metavar="NODE", help="this node's name, its topology (required)"),
            Arg(
                "--services",
                default="controller,node",
                metavar="LIST",
                help="the services to serve: controller, node or both (default: controller,node)",
            ),
            Arg("--metrics", metavar="ADDR:PORT", help="serve Prometheus metrics of the RPCs there"),
            Arg(
                "--max-volumes",
                type=int,
                default=0,
                metavar="N",
                help="the volumes this node can stage, as NodeGetInfo says (default 0: no limit)",
            ),
            REGISTRY,
            Arg("--reach", metavar="URL", help="with a registry: how other nodes reach this store (ssh://…)"),
            Arg("--bwlimit", metavar="RATE", help="with a registry: its agent pulls at most RATE a second"),
            log_level("volume"),
        ],
        "Serve the Container Storage Interface v1 over gRPC for kubelet and the CSI sidecars,\n"
        "with the volumes of --store. Runs until SIGTERM; mounts it staged stay up (one\n"
        "daemon per volume), and a plugin started again answers for them. With a registry\n"
        "(--registry or $CASFS_REGISTRY) it runs the node's replica agent too (--node-id is\n"
        "the node), and NodeStageVolume of a replicated volume read/write takes `active`.",
    ),
    Row(
        "snapshotter",
        "serve",
        snapshotter.cmd_serve,
        "serve containerd's snapshots API on a unix socket (a proxy plugin)",
        [
            Arg("--address", metavar="unix:///PATH", help="the socket to listen on (required)"),
            Arg(
                "--root",
                metavar="DIR",
                help="where active snapshots are mounted, under DIR/mounts (default /run/casfs-snapshotter)",
            ),
            log_level("snapshot key"),
        ],
        "Serve containerd.services.snapshots.v1.Snapshots with the volumes of --store, for\n"
        'containerd\'s [proxy_plugins.casfs] (type "snapshot"). Each active snapshot is a\n'
        "volume mounted by its own daemon, which outlives the server: running containers keep\n"
        "their rootfs across a restart. Runs until SIGTERM.",
    ),
    Row(
        "snapshotter",
        "prime",
        snapshotter.cmd_prime,
        "tell containerd an image casfs holds is unpacked (its import then unpacks nothing)",
        [
            Arg("image", metavar="IMAGE", help="an OCI image of the store (`casfs image import`)"),
            Arg("--containerd", metavar="unix:///PATH", help="containerd's socket (required)"),
            Arg(
                "--namespace",
                default="default",
                metavar="NS",
                help="containerd's namespace (default: default)",
            ),
            Arg(
                "--snapshotter",
                default="casfs",
                metavar="NAME",
                help="the proxy plugin's name (default: casfs)",
            ),
            Arg(
                "--expires",
                type=float,
                default=600.0,
                metavar="SECONDS",
                help="how long containerd keeps the primed layers before the image is imported (default 600)",
            ),
            JSON_LIST,
        ],
        "For each layer chain of IMAGE, a Prepare labelled containerd.io/snapshot.ref through\n"
        "containerd's Snapshots service: the casfs snapshotter answers AlreadyExists and\n"
        "containerd records the layer as unpacked (the remote-snapshot convention).",
    ),
    Row(
        "config",
        "unset",
        maintenance.cmd_config_unset,
        "forget a stored setting (back to its default)",
        [Arg("key", metavar="KEY")],
    ),
)
