#!/usr/bin/env python3
"""How long does `casfs image import` of a Debian-sized OCI image take, next to
`umoci unpack` into a plain directory and `skopeo copy` into another layout?

    python benchmarks/oci_bench.py [--trees DIR ...] [--workdir DIR] [--json]

The image is built first (untimed) with umoci from copies of this host's trees (default:
/etc, /usr/lib/python3.11, /usr/lib/python3, /usr/share/perl, /usr/share/zoneinfo, about
the size of debian:bookworm): `base`, one gzip layer of those trees; `app`, base plus a
small layer; `app2`, base plus another small layer. One run of each step, the page cache
dropped before each (when root), everything on --workdir's filesystem:

  umoci unpack   `umoci unpack --image L:app` into a plain directory (no fsync)
  skopeo copy    `skopeo copy oci:L:app oci:L2:app` (verifies and copies the blobs)
  casfs import   `casfs image import app oci:L:app` into an empty store: every digest
                 checked, both layers applied, chunks hashed, compressed and fsynced
  casfs shared   `casfs image import app2 oci:L:app2` next: the base is app's, not read

and the store's figures (`image ls`: stored and unique bytes of app and app2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchlib import CLI, ROOTFS_TREES, arguments, drop_caches, scratch, sh, timed

from casfs.units import format_size


def du(path: Path) -> int:
    return int(sh("du", "-sb", path).split()[0])


def build(work: Path, trees: list[str]) -> Path:
    layout = work / "layout"
    sh("umoci", "init", "--layout", layout)
    sh("umoci", "new", "--image", f"{layout}:empty")
    bundle = work / "bundle"
    sh("umoci", "unpack", "--image", f"{layout}:empty", bundle)
    for t in trees:
        dest = bundle / "rootfs" / t.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        sh("cp", "-a", t, dest)
    sh("umoci", "repack", "--image", f"{layout}:base", bundle)
    shutil.rmtree(bundle)
    for tag in ("app", "app2"):
        sh("umoci", "unpack", "--image", f"{layout}:base", bundle)
        app = bundle / "rootfs" / "app"
        app.mkdir()
        (app / "main.py").write_text(f"print('{tag}')\n")
        (app / "data.bin").write_bytes(os.urandom(1 << 20))
        sh("umoci", "repack", "--image", f"{layout}:{tag}", bundle)
        shutil.rmtree(bundle)
    return layout


def run(work: Path, trees: list[str]) -> dict[str, Any]:
    print(f"building the image from {' '.join(trees)} …", file=sys.stderr)
    layout = build(work, trees)
    store = work / "store"
    casfs = " ".join([*CLI, "-s", str(store)])
    subprocess.run([*CLI, "-s", str(store), "init"], check=True, capture_output=True)
    steps = {
        "umoci unpack": f"umoci unpack --image {layout}:app {work / 'unpacked'}",
        "skopeo copy": f"skopeo copy --quiet oci:{layout}:app oci:{work / 'copy'}:app",
        "casfs import": f"{casfs} image import app oci:{layout}:app",
        "casfs shared": f"{casfs} image import app2 oci:{layout}:app2",
    }
    dropped = drop_caches()
    seconds = {}
    for step, cmd in steps.items():
        drop_caches()
        seconds[step] = timed(cmd, timeout=3600)
    ls = {i["name"]: i for i in json.loads(sh(*CLI, "-s", store, "image", "ls", "--json"))}
    return {
        "trees": trees,
        "unpacked_bytes": du(work / "unpacked" / "rootfs"),
        "layout_bytes": du(layout / "blobs"),
        "files": int(sh("bash", "-c", f"find {work / 'unpacked' / 'rootfs'} | wc -l").strip()),
        "caches_dropped": dropped,
        "cpus": os.cpu_count(),
        "seconds": seconds,
        "casfs_vs_umoci": seconds["casfs import"] / seconds["umoci unpack"],
        "casfs_vs_skopeo": seconds["casfs import"] / seconds["skopeo copy"],
        "shared_vs_first": seconds["casfs shared"] / seconds["casfs import"],
        "images": {n: {k: ls[n][k] for k in ("size", "stored", "unique")} for n in ("app", "app2")},
        "layers_reused": {n: ls[n]["oci"]["layers_reused"] for n in ("app", "app2")},
    }


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--trees", nargs="+", default=list(ROOTFS_TREES), help="host trees the image is made of")
    args = ap.parse_args()
    with scratch(args.workdir, "casfs-oci-bench-", mounts=()) as work:
        report = run(work, args.trees)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if not report["caches_dropped"]:
        print("note: page cache not dropped (needs root): reads may come from memory", file=sys.stderr)
    print(
        f"image: {format_size(report['unpacked_bytes'])} in {report['files']} entries, "
        f"{format_size(report['layout_bytes'])} of gzip blobs; {report['cpus']} CPUs"
    )
    for step, s in report["seconds"].items():
        print(f"{step:<14} {s:8.2f} s")
    print(
        f"casfs import / umoci unpack {report['casfs_vs_umoci']:.2f}x, / skopeo copy "
        f"{report['casfs_vs_skopeo']:.2f}x; shared import / first {report['shared_vs_first']:.2f}x"
    )
    for name, figures in report["images"].items():
        print(
            f"image {name}: size {format_size(figures['size'])}, stored {format_size(figures['stored'])}, "
            f"unique {format_size(figures['unique'])}, layers reused {report['layers_reused'][name]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
