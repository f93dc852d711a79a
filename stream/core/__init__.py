"""What the daemon, the state store, the device and the commands share: the configuration, payloads and control
messages, stream keys, the router that holds every stream's operator, period ticks, metrics and the release encoding.
Imports only :mod:`operators` and itself."""
