"""qlactors: a durable job runtime that runs commands as OS processes and never loses a result."""

__version__ = "0.1.0"
__all__ = ["__version__"]
