"""`python -m launcher.cli ...`, the same as `smlaunch ...`."""

from launcher.cli.app import main

main()
