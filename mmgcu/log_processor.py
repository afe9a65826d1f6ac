"""``GCULogProcessor``: mmengine's log line, with the card's peak memory.

Stock :class:`LogProcessor` adds ``memory`` only where CUDA or MUSA is available. This
adds it from the device layer: the peak MiB on this rank's card since the last log line.
"""

import re

from mmengine.registry import LOG_PROCESSORS
from mmengine.runner import LogProcessor

from .device import get_backend

_AFTER_TIMES = re.compile(r"(data_time: \S+  )")


@LOG_PROCESSORS.register_module()
class GCULogProcessor(LogProcessor):
    """A :class:`LogProcessor` that logs the GCU card's peak memory as ``memory``."""

    def get_log_after_iter(self, runner, batch_idx: int, mode: str):
        tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
        backend = get_backend()
        if "memory" in tag or not backend.is_gcu:
            return tag, log_str
        peak = backend.max_memory_allocated(backend.current_device())
        if peak is None:  # a generation without memory statistics
            return tag, log_str
        backend.reset_peak_memory_stats(backend.current_device())
        memory = int(peak / (1024 * 1024))
        tag["memory"] = memory
        item = f"memory: {memory}  "
        # Where mmengine puts it: after the timings, before the losses.
        log_str, found = _AFTER_TIMES.subn(lambda m: m.group(1) + item, log_str, count=1)
        if not found:
            log_str += item
        return tag, log_str
