"""`python -m casfs …`: the same as the `casfs` console script."""

from casfs.cli import run

run()
