"""The ``spotwise`` command line: one module per command group, discovered automatically."""
