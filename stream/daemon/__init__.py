"""``tops run``: the long-running daemon (``service``), its MQTT and stdin sources (``sources``), durable state
composed into it as it is built (``durability``; ``repeats``, the MQTT link's filter of redelivered messages) and the
checks before it starts (``preflight``). Imports ``state`` and ``core``."""
