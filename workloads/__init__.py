"""Workloads: arrival processes, length distributions, trace readers, shared prefixes, sessions."""
