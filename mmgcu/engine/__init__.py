"""The engine room: ``GCURunner`` and the GCU classes mmengine's runner builds for it
(loops, log processor, message hub, hooks)."""
