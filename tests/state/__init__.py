"""Tests of stream/state: the store, journal, checkpoints, spill, redelivery table, ledger and restarts."""
