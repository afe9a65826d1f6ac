"""``GCUError``: what mmgcu raises for a launch, set-up or run mistake it stops on.

Every room raises it (the device layer, checkpoints, locks, the watchdog), so it lives
below them all and imports nothing.
"""


class GCUError(RuntimeError):
    """A launch or set-up mistake mmgcu stops on, with a message that names the fix."""
