"""The `casfs` program: its console script (`run`) and `python -m casfs`."""

import gc

gc.disable()  # (for the start-up: casfs.cli.main enables it again, see there)

from casfs.cli import run  # noqa: E402

if __name__ == "__main__":
    run()
