"""The tops runtime: configuration, sources, ticking, routing, sinks, state, metrics and the command line."""
