"""The package version, in a module of its own: the recorder writes it into each
recording and the CLI prints it, and neither needs the package facade for that."""

__version__ = "0.1.0"
