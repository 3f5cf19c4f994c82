"""One module per `servesim` subcommand; each has `add_arguments(parser)` and `run(args) -> int`."""

# subcommand -> (module, one-line help). Modules are imported only when their command runs,
# so `servesim run` never pays for torch or matplotlib it does not use.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("experiments.commands.run", "simulate an experiment file and write a results folder"),
    "kv-size": ("experiments.commands.kv_size", "KV-cache bytes for a model geometry (see docs/kv-cache.md)"),
    "hardware": ("experiments.commands.hardware", "list the hardware and link presets the roofline prices steps on"),
    "profile": ("experiments.commands.profile", "time a grid of step shapes on the real torch engine"),
    "sweep": ("experiments.commands.sweep", "run every point of an experiment's sweep/variants (resumable)"),
    "report": ("experiments.commands.report", "print comparison tables for a run or sweep results folder"),
    "plot": ("experiments.commands.plot", "write comparison plots for a run or sweep results folder"),
    "capacity": ("experiments.commands.capacity", "find the highest request rate meeting SLOs, per policy"),
    "export": ("experiments.commands.export", "write results as vLLM `bench serve` result JSON"),
    "compare": ("experiments.commands.compare", "compare a vLLM `bench serve` result with simulated results"),
    "validate": ("experiments.commands.validate", "run an experiment on the real engine and on cheaper cost models, compare"),
    "calibrate": ("experiments.commands.calibrate", "fit the roofline's mfu, mbu and overheads to a measured profile"),
    "docs": ("experiments.commands.docs", "generate docs/yaml-reference.md from the experiment schema"),
}
