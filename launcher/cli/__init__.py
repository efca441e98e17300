"""`smlaunch`: the click group (app) and one module per command family."""

from launcher.cli.app import main

__all__ = ["main"]
