"""`python -m casfs …`: the same as the `casfs` console script."""

import sys

from casfs.cli import main

sys.exit(main())
