#!/usr/bin/env python3
"""How long does a short `casfs` command take, next to `qemu-img create -b` and the
interpreter doing nothing?

    python benchmarks/cli_start.py [--runs 20] [--casfs CMD ...] [--instructions] [--workdir DIR] [--json]

Orchestrators run the CLI once per volume, so its start-up is most of what a clone
costs them. Sets up a store (a 16 MiB raw image, a volume made from it with one
snapshot) and a qcow2 copy of the same image, then times, median of --runs rounds
after an untimed warm-up round, each round running every command once in turn (so
drift weighs on all alike):

    python -I -S -c pass          the bare interpreter (no site-packages)
    python -c pass                the interpreter with its site-packages' .pth files
    casfs --version               start-up and the parser, no store
    casfs volume ls               open the store, list
    casfs snapshot ls VOL         open the store, list a volume's snapshots
    casfs volume create --from    a clone of the image (removed again, untimed)
    casfs volume rm               removing such a clone (made again, untimed)
    qemu-img create -b            a qcow2 overlay on the qcow2 copy (removed, untimed)

Each figure is wall-clock (median and minimum) and the CPU time (user + system, which
a busy machine inflates less), with the wall median's ratio to `qemu-img create -b`.
`python` is the interpreter the casfs command runs.

--casfs CMD (repeatable) names a casfs to time, default the `casfs` script beside this
Python (else `python -m casfs`); leading VAR=VALUE words set its environment. Several
are timed interleaved, each with its own store, e.g. an install before and after:

    --casfs 'PYTHONPATH=/tmp/old /work/main/.venv/bin/casfs' --casfs /tmp/venv/bin/casfs

Bytecode is cached (PYTHONDONTWRITEBYTECODE is dropped; the warm-up round writes it),
as for a user's casfs. --instructions also runs each command once under valgrind
(callgrind) and reports the instructions it executed: a figure that a busy machine
does not move, for comparing installs when the times are noisy.
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
QEMU = "qemu-img create -b"


class Casfs:
    """One casfs to time: its command, its environment, its interpreter, its store."""

    def __init__(self, spec: str, store: Path, base_env: dict[str, str]) -> None:
        words = shlex.split(spec)
        self.env = dict(base_env)
        while words and "=" in words[0] and not words[0].startswith(("/", ".")):
            key, _, value = words.pop(0).partition("=")
            self.env[key] = value
        self.spec, self.cmd, self.store = spec, words, store
        self.python = _python_of(words)

    def cli(self, *args: str | Path) -> list[str]:
        return [*self.cmd, "-s", str(self.store), *map(str, args)]

    def steps(self) -> list[tuple[str, list[str], list[str] | None, list[str] | None]]:
        """(name, command, untimed before, untimed after)."""
        clone = self.cli("volume", "create", "c", "--from", "img")
        remove = self.cli("volume", "rm", "c")
        return [
            ("python -I -S -c pass", [self.python, "-I", "-S", "-c", "pass"], None, None),
            ("python -c pass", [self.python, "-c", "pass"], None, None),
            ("casfs --version", [*self.cmd, "--version"], None, None),
            ("casfs volume ls", self.cli("volume", "ls"), None, None),
            ("casfs snapshot ls", self.cli("snapshot", "ls", "v"), None, None),
            ("casfs volume create", clone, None, remove),
            ("casfs volume rm", remove, clone, None),
        ]


def _default_casfs() -> str:
    script = Path(sys.executable).parent / "casfs"
    return shlex.quote(str(script)) if script.exists() else shlex.join([sys.executable, "-m", "casfs"])


def _python_of(cmd: list[str]) -> str:
    """The interpreter a casfs command runs: its script's #! line, or the command itself."""
    if len(cmd) == 1:
        first = Path(cmd[0]).read_text().splitlines()[0]
        if first.startswith("#!"):
            return first[2:].strip().split()[0]
    return cmd[0]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one command, which must succeed."""
    cpu, t = _cpu(), time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=120)
    elapsed, cpu = time.perf_counter() - t, _cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)}: exit {done.returncode}: {done.stderr.decode().strip()}")
    return elapsed * 1000, cpu * 1000


def _instructions(cmd: list[str], env: dict[str, str]) -> float:
    """Millions of instructions one command executes (valgrind's count: the same on a
    busy machine as on an idle one, unlike any time)."""
    grind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    done = subprocess.run(
        [*grind, *cmd], capture_output=True, text=True, env={**env, "PYTHONHASHSEED": "0"}, timeout=600
    )
    found = [line for line in done.stderr.splitlines() if "Collected :" in line]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"valgrind {shlex.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")
    return int(found[-1].split(":")[-1]) / 1e6


def _figures(wall: list[float], cpu: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(wall),
        "min_ms": min(wall),
        "cpu_median_ms": statistics.median(cpu),
    }


def run(specs: list[str], runs: int, work: Path, instructions: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASFS_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    raw, base, over = work / "img.raw", work / "base.qcow2", work / "over.qcow2"
    raw.write_bytes(os.urandom(SIZE))
    sh("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, base)
    qemu = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(over)]
    casfses = [Casfs(spec, work / f"store{i}", env) for i, spec in enumerate(specs)]
    for c in casfses:
        for args in (["init"], ["image", "import", "img", raw], ["volume", "create", "v", "--from", "img"]):
            sh(*c.cli(*args), env=c.env)
        sh(*c.cli("snapshot", "create", "v"), env=c.env)
    # (config index or None for qemu-img, name) -> wall and CPU times
    wall: dict[tuple[int | None, str], list[float]] = {}
    cpu: dict[tuple[int | None, str], list[float]] = {}
    for i in range(runs + 1):  # (round 0: the warm-up, untimed)
        timed: list[tuple[int | None, str, list[str], list[str] | None, list[str] | None, dict[str, str]]] = [
            (k, name, cmd, before, after, c.env)
            for k, c in enumerate(casfses)
            for name, cmd, before, after in c.steps()
        ]
        timed.append((None, QEMU, qemu, None, ["rm", "-f", str(over)], env))
        for k, name, cmd, before, after, cenv in timed:
            if before is not None:
                _run(before, cenv)
            w, c_ms = _run(cmd, cenv)
            if i:
                wall.setdefault((k, name), []).append(w)
                cpu.setdefault((k, name), []).append(c_ms)
            if after is not None:
                _run(after, cenv)
    minstr: dict[tuple[int | None, str], float] = {}
    for k, name, cmd, before, after, cenv in timed if instructions else ():
        if before is not None:
            _run(before, cenv)
        minstr[k, name] = _instructions(cmd, cenv)
        if after is not None:
            _run(after, cenv)
    return {
        "runs": runs,
        "qemu": {
            "command": shlex.join(qemu),
            **_figures(wall[None, QEMU], cpu[None, QEMU]),
            **({"minstr": minstr[None, QEMU]} if instructions else {}),
        },
        "casfs": [
            {
                "casfs": c.spec,
                "python": c.python,
                "commands": {
                    name: {
                        "command": shlex.join(cmd),
                        **_figures(wall[k, name], cpu[k, name]),
                        **({"minstr": minstr[k, name]} if instructions else {}),
                    }
                    for name, cmd, _, _ in c.steps()
                },
            }
            for k, c in enumerate(casfses)
        ],
    }


def render(report: dict[str, Any]) -> str:
    qemu = report["qemu"]
    n = len(report["casfs"])
    lines = []
    for k, c in enumerate(report["casfs"]):
        lines.append(f"[{k}] casfs = {c['casfs']}; python = {c['python']}")
    head = f"{'command':22}" + "".join(
        f" | [{k}] {'median':>7} {'min':>6} {'cpu':>6} {'/qemu':>6}" for k in range(len(report["casfs"]))
    )
    lines += ["", head + "   (ms)"]
    for name in report["casfs"][0]["commands"]:
        cells = ""
        for c in report["casfs"]:
            f = c["commands"][name]
            ratio = f["median_ms"] / qemu["median_ms"]
            cells += (
                f" |     {f['median_ms']:7.1f} {f['min_ms']:6.1f} {f['cpu_median_ms']:6.1f} {ratio:5.2f}x"
            )
        lines.append(f"{name:22}{cells}")
    q = qemu
    lines.append(
        f"{QEMU:22} |     {q['median_ms']:7.1f} {q['min_ms']:6.1f} {q['cpu_median_ms']:6.1f} {1:5.2f}x"
    )
    if "minstr" in q:
        lines += [
            "",
            f"{'instructions (M)':22}" + "".join(f" | [{k}] {'':>9} {'/qemu':>6}" for k in range(n)),
        ]
        for name in report["casfs"][0]["commands"]:
            counts = [c["commands"][name]["minstr"] for c in report["casfs"]]
            cells = "".join(f" |     {m:9.1f} {m / q['minstr']:5.2f}x" for m in counts)
            lines.append(f"{name:22}{cells}")
        lines.append(f"{QEMU:22} |     {q['minstr']:9.1f} {1:5.2f}x")
    return "\n".join(lines)


def main() -> None:
    p = arguments(__doc__)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--casfs", action="append", metavar="CMD", help="a casfs to time (repeatable)")
    p.add_argument(
        "--instructions", action="store_true", help="also count each command's instructions under valgrind"
    )
    a = p.parse_args()
    with scratch(a.workdir, "casfs-cli-start-", mounts=()) as work:
        report = run(a.casfs or [_default_casfs()], a.runs, work, a.instructions)
    emit(
        report,
        a.json,
        f"CLI start-up, ms: wall median and minimum, CPU median, of {report['runs']} interleaved rounds",
        *render(report).splitlines(),
    )


if __name__ == "__main__":
    main()
