"""The package version, in one place (importable from every layer)."""

__version__ = "0.2.0"
