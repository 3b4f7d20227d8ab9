"""Redis key names that more than one layer reads: defined once here, used by the owner and its readers."""

BUS_HANDLERS = "examlops:bus:handlers"
"""Hash: bus address -> the UNIX time of the last heartbeat of a bridge serving it (written by the bus,
read by `exa up` to see that a bridge is serving)."""
