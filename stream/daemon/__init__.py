"""``tops run``: the long-running daemon (``service``), its MQTT and stdin sources (``sources``), durable state
wired into its lifecycle (``durability``) and the checks before it starts (``preflight``). Imports ``state`` and
``core``."""
