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
.venv/bin/python -m pytest -p no:cacheprovider --timeout="${CASFS_TEST_TIMEOUT:-300}" \
    --timeout-method=thread "$@"
rc=$?
if ((rc == 5)); then
    echo "test.sh: pytest collected no tests" >&2
elif ((rc == 0 && check != 0)); then
    echo "test.sh: the tests passed but scripts/check.sh failed" >&2
    rc=$check
fi
exit $rc
