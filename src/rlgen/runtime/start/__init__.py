"""Set-up's helpers: the loaders that run beside the cluster's start (``loaders``), work on a thread of its own
(``on_thread``), engines asked for before their model folder is built (``early_engines``) and the start-up's
progress lines and timings (``progress``)."""
