"""Models torch_gcu/core/version.py of a 1.x release: the version is ``get_version()`` (the
TopsRider version); the module has no ``__version__``."""

__all__ = ["get_version"]


def get_version() -> str:
    return "2.5.136+sim"
