"""Models torch_gcu/amp of a 1.x release."""

from .autocast_mode import autocast
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast"]
