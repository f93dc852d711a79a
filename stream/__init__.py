"""The tops runtime around the pure operators (``operators``), one folder a part, imports in one direction:

* ``cli``: the ``tops`` command, one subcommand per module;
* ``commands/``: the offline commands (replay, evaluate, query, compare, simulate, state);
* ``daemon/``: ``tops run``, the long-running service, its sources and durable state;
* ``device/``: ``tops device``, the device side of local mode;
* ``state/``: the state store, the input journal, the outbox spill;
* ``core/``: configuration, payloads, control messages, keys, the router, ticks, metrics, release encoding;
* ``data/``: the shipped streams.

``commands -> daemon -> state -> core -> operators`` and ``device -> core``; never the other way.
"""
