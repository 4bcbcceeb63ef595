#!/usr/bin/env bash
# `apt-get ARGS`, waiting while another apt or dpkg holds its locks (an unattended upgrade,
# a second install.sh) instead of failing: dpkg's lock by apt's own timeout, the package
# lists' lock (which that timeout does not cover in apt 2.6) by asking again, for up to
# ten minutes. Any other failure is returned at once.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((try = 0; try < 60; try++)); do
    apt-get -o DPkg::Lock::Timeout=600 "$@" 2>&1 | tee "$log"  # (shown as it comes)
    rc=${PIPESTATUS[0]}
    if ((rc == 0)) || ! grep -q "Could not get lock" "$log"; then
        exit "$rc"
    fi
    echo "apt-wait.sh: another apt holds its lock; again in 10 s" >&2
    sleep 10
done
exit $rc
