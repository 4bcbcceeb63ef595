#!/usr/bin/env bash
# The one check command (CI runs it through test.sh): ruff format check and lint, then
# mypy strict over casfs, tests and benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${VENV:-.venv}/bin
rc=0
"$bin/ruff" format --check casfs tests benchmarks || rc=1
"$bin/ruff" check casfs tests benchmarks || rc=1
"$bin/mypy" || rc=1   # strict, over [tool.mypy] files in pyproject.toml: casfs, tests, benchmarks
exit $rc
