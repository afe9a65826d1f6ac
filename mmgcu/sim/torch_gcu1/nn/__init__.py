"""Models torch_gcu/nn of a 1.x release."""

from . import parallel  # noqa: F401
