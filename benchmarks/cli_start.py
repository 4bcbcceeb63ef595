#!/usr/bin/env python3
"""How long does a short `casfs` command take, next to `qemu-img create -b` and the
interpreter doing nothing?

    python benchmarks/cli_start.py [--runs 20] [--casfs CMD] [--workdir DIR] [--json]

Orchestrators run the CLI once per volume, so its start-up is most of what a clone
costs them. Sets up a store (a 16 MiB raw image, a volume made from it with one
snapshot) and a qcow2 copy of the same image, then times wall-clock, median of --runs
rounds after a warm-up round, each round running every command once in turn (so
drift weighs on all alike), and the CPU time (user + system) each took, which a busy
machine inflates less:

    python -I -S -c pass          the bare interpreter (no site-packages)
    python -c pass                the interpreter with its site-packages' .pth files
    casfs --version               start-up and the parser, no store
    casfs volume ls               open the store, list
    casfs snapshot ls VOL         open the store, list a volume's snapshots
    casfs volume create --from    a clone of the image (removed again, untimed)
    casfs volume rm               removing such a clone
    qemu-img create -b            a qcow2 overlay on the qcow2 copy (removed, untimed)

and prints each (wall median and minimum, CPU median) beside its wall ratio to
`qemu-img create -b` and to `python -c pass`.
`--casfs` names the command to time (default: the `casfs` script beside this Python,
else `python -m casfs`): e.g. a venv installed another way. `python` is the one the
casfs script runs.
"""

from __future__ import annotations

import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import arguments, emit, scratch, sh

SIZE = 16 << 20


def _default_casfs() -> list[str]:
    script = Path(sys.executable).parent / "casfs"
    return [str(script)] if script.exists() else [sys.executable, "-m", "casfs"]


def _python_of(casfs: list[str]) -> str:
    """The interpreter a casfs command runs: its script's #! line, or the command itself."""
    if len(casfs) == 1:
        first = Path(casfs[0]).read_text().splitlines()[0]
        if first.startswith("#!"):
            return first[2:].strip().split()[0]
    return casfs[0]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) milliseconds of one command. (CPU time is what a busy
    machine does not inflate: the two cores here are shared.)"""
    cpu, t = _cpu(), time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=120)
    elapsed, cpu = time.perf_counter() - t, _cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)}: exit {done.returncode}: {done.stderr.decode().strip()}")
    return elapsed * 1000, cpu * 1000


def run(casfs: list[str], runs: int, work: Path) -> dict[str, Any]:
    # Without PYTHONDONTWRITEBYTECODE: a user's casfs runs from cached bytecode (the
    # untimed warm-up round writes it), not by compiling every module at each start.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASFS_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    store = work / "store"
    cli = [*casfs, "-s", str(store)]
    raw, base, over = work / "img.raw", work / "base.qcow2", work / "over.qcow2"
    raw.write_bytes(os.urandom(SIZE))
    for args in (["init"], ["image", "import", "img", raw], ["volume", "create", "v", "--from", "img"]):
        sh(*cli, *args, env=env)
    sh(*cli, "snapshot", "create", "v", env=env)
    sh("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, base)
    python = _python_of(casfs)
    steps: list[tuple[str, list[str], list[str] | None]] = [
        ("python -I -S -c pass", [python, "-I", "-S", "-c", "pass"], None),
        ("python -c pass", [python, "-c", "pass"], None),
        ("casfs --version", [*casfs, "--version"], None),
        ("casfs volume ls", [*cli, "volume", "ls"], None),
        ("casfs snapshot ls", [*cli, "snapshot", "ls", "v"], None),
        (
            "casfs volume create",
            [*cli, "volume", "create", "c", "--from", "img"],
            [*cli, "volume", "rm", "c"],
        ),
        ("casfs volume rm", [*cli, "volume", "rm", "c"], None),
        (
            "qemu-img create -b",
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(over)],
            ["rm", "-f", str(over)],
        ),
    ]
    wall: dict[str, list[float]] = {name: [] for name, _, _ in steps}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in steps}
    for i in range(runs + 1):  # (round 0: the warm-up, untimed)
        for name, cmd, after in steps:
            if name == "casfs volume rm":  # (the clone it removes, made untimed)
                _run([*cli, "volume", "create", "c", "--from", "img"], env)
            w, c = _run(cmd, env)
            if i:
                wall[name].append(w)
                cpu[name].append(c)
            if after is not None:
                _run(after, env)
    return {
        "runs": runs,
        "casfs": shlex.join(casfs),
        "python": python,
        "commands": {name: shlex.join(cmd) for name, cmd, _ in steps},
        "median_ms": {name: statistics.median(t) for name, t in wall.items()},
        "min_ms": {name: min(t) for name, t in wall.items()},
        "cpu_median_ms": {name: statistics.median(t) for name, t in cpu.items()},
    }


def render(report: dict[str, Any]) -> str:
    med, low, cpu = report["median_ms"], report["min_ms"], report["cpu_median_ms"]
    qemu, floor = med["qemu-img create -b"], med["python -c pass"]
    lines = [f"{'command':24} {'median ms':>10} {'min ms':>8} {'cpu ms':>8} {'/qemu-img':>10} {'/python':>8}"]
    for name, ms in med.items():
        lines.append(
            f"{name:24} {ms:10.1f} {low[name]:8.1f} {cpu[name]:8.1f} {ms / qemu:9.2f}x {ms / floor:7.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    p = arguments(__doc__)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--casfs", help="the casfs command to time (default: %(default)s)")
    a = p.parse_args()
    casfs = shlex.split(a.casfs) if a.casfs else _default_casfs()
    with scratch(a.workdir, "casfs-cli-start-", mounts=()) as work:
        report = run(casfs, a.runs, work)
    emit(
        report,
        a.json,
        f"CLI start-up: wall ms, median of {report['runs']} interleaved rounds "
        f"(casfs = {report['casfs']}; python = {report['python']})",
        "",
        render(report),
    )


if __name__ == "__main__":
    main()
