"""One module a sub-command: `add_parser(subparsers)` adds the command and its arguments and
sets `func` to the module's `run(args) -> int`, which calls one function elsewhere and
returns the exit code. cli.COMMANDS lists them in the order --help shows."""
