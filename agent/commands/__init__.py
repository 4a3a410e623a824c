"""One module per `crucible` subcommand; see agent/cli.py for the contract."""
