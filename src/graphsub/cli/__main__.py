"""`python -m graphsub.cli`, as the `graphsub` command."""

from graphsub.cli import main

main()
