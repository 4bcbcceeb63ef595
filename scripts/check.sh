#!/usr/bin/env bash
# The one check command (CI runs it through test.sh): ruff format check and lint, then
# mypy strict over casfs.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${VENV:-.venv}/bin
rc=0
"$bin/ruff" format --check casfs tests benchmarks || rc=1
"$bin/ruff" check casfs tests benchmarks || rc=1
"$bin/mypy" casfs || rc=1   # strict: see [tool.mypy] in pyproject.toml
exit $rc
