"""Tests of the cluster workers on a real three-node NATS JetStream cluster."""
