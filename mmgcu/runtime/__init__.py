"""The runtime room: what keeps a multi-process job honest around training (process
groups, locks on cards and work dirs, heartbeats, how a failed run ends)."""
