"""The compat room: every use of a private name of mmengine, in one module
(:mod:`mmgcu.compat.mmengine`), pinned to the version it mirrors."""
