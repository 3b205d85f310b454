"""One module per CLI command; each depends only downward (config, plan, runtime)."""
