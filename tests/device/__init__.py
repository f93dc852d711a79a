"""Tests of the device side of local mode: the Device API, its control protocol and limits, and `tops device`."""
