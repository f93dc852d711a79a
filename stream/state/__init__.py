"""The state store on disk: SQLite checkpoints and the privacy ledger (``store``), the input journal (``journal``),
the outbox spill (``spill``) and the keyed digests of redelivered MQTT messages (``redelivery``); and the layers the
daemon's router is built with: new streams admitted by the ledger and restored (``admission``), the intake that
journals what it accepts (``journaled``). Imports ``core``."""
