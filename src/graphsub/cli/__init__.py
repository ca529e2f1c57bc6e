"""The `graphsub` command line: the app and what every command shares (`cli.app`), the
commands on a model (`cli.commands`), the rule generator and verifier (`cli.generate`) and
`graphsub explain` (`cli.explain`). Importing the package registers every command on the app."""

from graphsub.cli import commands, explain, generate  # noqa: F401  (register their commands)
from graphsub.cli.app import app, main, parse_input_shapes

__all__ = ["app", "main", "parse_input_shapes"]
