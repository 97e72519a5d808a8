"""`python -m qlactors` is the `qlactors` command."""

from .cli import entry

entry()
