"""Tests of stream/core: configuration, payload decoding, the router, release encoding, the publish queue."""
