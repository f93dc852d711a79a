"""``tops device``: the device side of local mode (``client``: control messages checked against the device's pinned
limits, local randomizers, reports) and its limits, account and state file (``policy``). Imports ``core``."""
