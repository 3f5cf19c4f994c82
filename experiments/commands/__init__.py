"""One module per `servesim` subcommand; each has `add_arguments(parser)` and `run(args) -> int`."""

# subcommand -> (module, one-line help). Modules are imported only when their command runs,
# so `servesim run` never pays for torch or matplotlib it does not use.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("experiments.commands.run", "simulate an experiment file and write a results folder"),
    "kv-size": ("experiments.commands.kv_size", "KV-cache bytes for a model geometry (seed eq. 21.2)"),
    "profile": ("experiments.commands.profile", "time a grid of step shapes on the real torch engine"),
}
