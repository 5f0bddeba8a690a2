"""``python -m spotwise``: the ``spotwise`` command with this interpreter (a job file's
``python -m spotwise run -- ...`` needs no virtualenv on PATH)."""

from spotwise.cli.main import main

main()
