"""``python -m pipesched`` runs the command line."""

from .cli import main

main()
