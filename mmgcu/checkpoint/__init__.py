"""The checkpoint room: plain checkpoints written atomically, a resume that is never
silent, and the hooks that put both in mmengine's save and load."""
