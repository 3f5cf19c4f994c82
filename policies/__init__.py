"""Scheduling policies: synchronous, SimPy-free; tests drive schedule()/complete() directly."""
