"""`rlgen serve`: engines started from the plan, behind an HTTP API (``rlgen.serve.app``), and the wire format
shared with ``rlgen.wire.client`` (``rlgen.wire.protocol``)."""
