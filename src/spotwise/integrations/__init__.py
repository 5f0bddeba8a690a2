"""Adapters that give other training frameworks' loops spotwise's exact resume and notices.
Each imports its framework lazily (a missing one names its ``spotwise[extra]``)."""
