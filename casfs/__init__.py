"""casfs: a content-addressed filesystem for virtual machines and containers."""

__version__ = "0.1.0"
