"""The cluster a run uses: a local Ray cluster in a session of its own (``local_ray``), which Ray node holds each
plan node (``nodes``), the actors in their placement groups (``actors``), every wait on an actor (``waits``),
engines kept warm for the next run (``kept_engines``) and what a dead run's cluster left behind
(``dead_runs``)."""
