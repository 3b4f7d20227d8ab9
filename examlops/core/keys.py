"""Redis key names that more than one layer reads: defined once here, used by the owner and its readers."""

BUS_HANDLERS = "examlops:bus:handlers"
"""Hash: bus address -> the UNIX time of the last heartbeat of a bridge serving it (written by the bus,
read by `exa up` to see that a bridge is serving)."""

AUDITED_ALIASES = "examlops:audit:aliases"
"""Hash: ``<model>/<Alias>`` -> JSON of the last alias event the audit trail holds for it (intended, moved or
failed; written right after the event by whoever appended it), so that `exa promote` and `exa audit verify`
can compare the registry with the trail without walking the chain."""

AUDIT_VERIFIED = "examlops:audit:verified"
"""String: the last `exa audit verify` result (JSON with an HMAC, ``monitoring.audit.verified``), written by
`exa audit verify` and the retention flow, read by the dashboard instead of walking the chain."""

AUDIT_VERIFYING = "examlops:audit:verifying"
"""String with an expiry: the lease of the verify under way (``monitoring.audit.verified.one_verify``)."""
