#!/usr/bin/env bash
# What CI runs: install (idempotent), the check command, then the whole test suite.
# Exits with pytest's code ("no tests collected", 5, is a failure too), or with the
# check's when the tests passed and the check did not. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh || exit $?
./scripts/check.sh
check=$?
# A per-test timeout; the thread method, because a test stuck in a FUSE syscall never
# sees SIGALRM: it dumps every thread's stack and ends the run instead of hanging CI.
# One worker per core, at most four (pytest-xdist; every fixture is per test or per worker:
# temp dirs, free ports, its own servers). CASFS_TEST_WORKERS=0 runs in this process.
cores=$(nproc)
workers=${CASFS_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
pytest=(.venv/bin/python -m pytest -p no:cacheprovider --timeout="${CASFS_TEST_TIMEOUT:-300}"
    --timeout-method=thread -n "$workers")
"${pytest[@]}" "$@"
rc=$?
# Every mount test in both passthrough modes (tests/helpers/cli.py: CASFS_TEST_PASSTHROUGH):
# the whole suite in the default (on), then the tests that mount through the test
# helpers once more with it off (--no-passthrough: writable mounts have the writeback
# cache; passthrough's own test modules skip themselves). Only for a whole run (no
# arguments but options); CASFS_TEST_BOTH_MODES=0 skips it.
whole=1
for arg in "$@"; do [[ $arg == -* ]] || whole=0; done
if ((rc == 0 && whole)) && [[ ${CASFS_TEST_BOTH_MODES:-1} == 1 ]]; then
    CASFS_TEST_PASSTHROUGH=off "${pytest[@]}" "$@" tests/mount tests/model/test_mount_dir_model.py
    rc=$?
fi
if ((rc == 5)); then
    echo "test.sh: pytest collected no tests" >&2
elif ((rc == 0 && check != 0)); then
    echo "test.sh: the tests passed but scripts/check.sh failed" >&2
    rc=$check
fi
exit $rc
