"""Models torch_gcu/distributed of a 1.x release (see ``distributed_c10d``)."""

from .distributed_c10d import (  # noqa: F401
    Backend,
    GroupMember,
    ProcessGroupECCL,
    ReduceOp,
    _get_default_group,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    destroy_process_group,
    get_backend,
    get_local_rank,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_eccl_available,
    is_initialized,
    new_group,
)
