"""The package's version, in one place: pyproject.toml reads it (``dynamic = ["version"]``) and
``bcos_plugins.__version__`` re-exports it. A release changes this constant and dates its CHANGELOG section."""

__version__ = "0.2.0"
