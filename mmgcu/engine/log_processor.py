"""``GCULogProcessor``: mmengine's log line, with the card's memory.

Stock :class:`LogProcessor` adds ``memory`` only where CUDA or MUSA is available. This
adds it from the accelerator ``GCURunner`` binds to it, at the end of the line: the peak
MiB on this rank's card since the last line (torch_gcu 2.x), or the MiB allocated now
(torch_gcu 1.x, which counts no peak). Where the kind reports no memory, the line is
mmengine's; off a GCU card (another runner, the CPU, CUDA) the processor is mmengine's.
"""

from mmengine.registry import LOG_PROCESSORS
from mmengine.runner import LogProcessor

from ..binding import CardBound
from ..counterparts import replaces


@LOG_PROCESSORS.register_module()
@replaces(
    LogProcessor,
    why="its memory column exists only where CUDA is available",
    does="it logs the card's memory in the memory column",
)
class GCULogProcessor(CardBound, LogProcessor):
    """A :class:`LogProcessor` that logs the GCU card's memory as ``memory`` (MiB)."""

    off_card = "acts as mmengine's LogProcessor"

    def get_log_after_iter(self, runner, batch_idx: int, mode: str):
        tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
        accelerator = self.card_accelerator()
        if accelerator is None or "memory" in tag:
            return tag, log_str
        used = accelerator.peak_memory(accelerator.current_device())
        if used is not None:
            tag["memory"] = used // (1024 * 1024)
            log_str += f"  memory: {tag['memory']}"
        return tag, log_str
