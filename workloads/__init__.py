"""Workloads: arrival processes, length distributions, trace readers, shared prefixes, sessions.

Entry points (workloads.spec): `parse_workload(mapping, source=...)` validates an experiment
file's `workload:` section; `build_requests(spec, seed=..., base_dir=...)` returns the requests;
`build_workload(...)` returns them with notes for the user. For sessions,
`workloads.sessions.session_think_times(requests)` gives each later turn's think time.
"""
