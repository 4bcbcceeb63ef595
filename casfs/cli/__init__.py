"""The `casfs` command line: nouns then verbs, one line per error, an exit code per kind.

    grammar.py    the grammar, as a table
    quick.py      plain command lines parsed from it (nearly every call)
    parser.py     the (lazily built) argparse parser: every other line, help, errors
    output.py     tables, JSON, key-values, progress, error and warning lines
    store.py      opening the store (after recovery), the totals line, export checks
    images.py, volumes.py, snapshots.py, maintenance.py, mounts.py: one module per noun

Exit codes come from CasfsError.exit_code: 0 success, 2 bad usage, 3 not found,
4 conflict or busy, 5 corruption, 1 anything else, 130 interrupted.

Orchestrators call the CLI once per volume, so its start-up is kept small: the parser
imports no command's module (grammar._Module), a command imports what it needs inside
its function, and only `casfs mount`/`umount` load trio and pyfuse3
(tests/unit/test_cli_start.py and test_layers.py check what commands load;
benchmarks/cli_start.py times them).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import TYPE_CHECKING

from casfs.cli.output import error
from casfs.errors import CasfsError, of_database

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import SimpleNamespace
    from typing import NoReturn


def _traceback() -> None:
    import traceback

    traceback.print_exc()


def run() -> NoReturn:
    """The `casfs` program (casfs.__main__): main(), then the exit. A command that left
    its store's catalog open for it (cli.store) ends with os._exit, once the atexit
    functions ran and the output is flushed, unless another thread is still running:
    what a normal exit would do after that (tear the modules down, close the catalog)
    would only checkpoint the catalog's WAL."""
    from casfs.cli.store import Exit

    Exit.fast = True
    code = main()
    threading = sys.modules.get("threading")
    if Exit.catalog_left_open and (threading is None or threading.active_count() == 1):
        import atexit

        atexit._run_exitfuncs()  # (e.g. logging's flush: as the exit would, first)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            pass  # (main's reader went away: as main says, not an error of ours)
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    from casfs.cli import quick

    plain = quick.parse(sys.argv[1:] if argv is None else argv)
    if plain is not None:
        args: SimpleNamespace | argparse.Namespace = plain
    else:  # (argparse takes the line, with its help and errors)
        from casfs.cli.parser import parse

        args = parse(argv)
    # What is loaded by now lives as long as the process: the collector need not walk it
    # again at each full collection while the command imports its own modules (7% of a
    # clone's instructions). Documented for this (gc.freeze: "before a fork"), it is as
    # good for a short process; the garbage frozen with it is a parser's few kilobytes.
    # The program (casfs.__main__) starts with the collector off, for the same reason
    # (its 20 collections while loading were 3 M of a clone's 122 M instructions): on
    # again for the command, which may run for hours.
    gc.freeze()
    gc.enable()
    verbose = bool(args.verbose)
    try:
        return int(args.func(args))
    except CasfsError as e:
        if verbose:
            _traceback()
        error(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        print("casfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`casfs image ls | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if verbose:
            _traceback()
        where = f": {e.filename}" if e.filename else ""
        error(f"{e.strerror or e}{where}")
        return 1
    except Exception as e:
        if verbose:
            _traceback()
        mapped = of_database(e, _disk_full(args))
        if mapped is not None:
            error(str(mapped))
            return mapped.exit_code
        error(f"unexpected {type(e).__name__}: {e} (rerun with -v for the traceback)")
        return 1


def _disk_full(args: SimpleNamespace | argparse.Namespace) -> bool:
    """Whether the store's disk has no room left (asked only of a failed command)."""
    from casfs.repo import store_path
    from casfs.store.reserve import free_bytes

    try:
        return free_bytes(store_path(getattr(args, "store", None))) == 0
    except Exception:  # (no store named, or none there: not known to be full)
        return False
