"""Traces shipped with servesim (a package only so that its data files are installed with it)."""
