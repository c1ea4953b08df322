"""The package version, importable without torch (``pyg-sar --version``)."""
__version__ = '0.1.0'
