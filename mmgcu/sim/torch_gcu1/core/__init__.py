"""torch_gcu/core of a 1.x release: devices, seeding, memory, the lazy step, torch overrides."""
