"""``RehearsalError``: what a rehearsal refuses before its jobs start."""


class RehearsalError(ValueError):
    """An argument, a config or training script that cannot be found, or a work dir the
    rehearsal must not clear, as one line that names the fix."""
