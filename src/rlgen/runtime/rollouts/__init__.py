"""The engines' side of a step: prompts rendered into requests and padded batches (``batch``), the requests in
flight and their results (``in_flight``), launching and collecting them (``generation``), dynamic sampling's
further rounds (``refill``) and re-creating an engine that died (``engine_restarts``)."""
