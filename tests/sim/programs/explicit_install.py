"""install(cards=4, api='gcu1') without any MMGCU_* variable."""

import json

import sim_alone  # noqa: F401

from mmgcu.sim import install

torch_gcu = install(cards=4, api="gcu1")
import torch  # noqa: E402

print(
    json.dumps(
        {
            "count": torch_gcu.device_count(),
            "device": str(torch_gcu.gcu_device(3)),
            "has_torch_gcu_module": hasattr(torch, "gcu"),
        }
    )
)
