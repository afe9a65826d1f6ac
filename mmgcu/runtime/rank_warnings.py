"""OpenMMLab's warnings once per job: rank 0 shows them, the other ranks do not.

mmseg warns as a model is built (``build_loss`` deprecated, ``avg_non_ignore``) and as its
visualization hook is (``The draw is False``): the same words once per rank, eight times on
a T20. :func:`show_library_warnings_on_rank_0` filters, on every rank but 0, the warnings
that OpenMMLab's own modules raise; ``GCURunner`` calls it before it builds anything. A
user's own warnings, and torch's, are shown on every rank.
"""

import os
import warnings

#: The packages whose warnings are the same on every rank: configs and models they build.
LIBRARIES = ("mmseg", "mmengine", "mmcv", "mmdet", "mmpretrain")
#: Where launchers put the global rank before any process group exists.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def launcher_rank() -> int:
    """This process's global rank, from the launcher's variables (0 without a launcher)."""
    for name in RANK_VARS:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def show_library_warnings_on_rank_0() -> None:
    """On a rank other than 0, ignore warnings raised in OpenMMLab's modules."""
    if launcher_rank() != 0:
        warnings.filterwarnings("ignore", module=rf"({'|'.join(LIBRARIES)})(\.|$)")
