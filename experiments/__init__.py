"""Experiment files: schema, runner, sweeps, reports, plots and the `servesim` CLI."""
