"""The state store on disk: SQLite checkpoints and the privacy ledger (``store``), the input journal (``journal``),
the outbox spill (``spill``) and the keyed digests of redelivered MQTT messages (``redelivery``). Imports ``core``."""
