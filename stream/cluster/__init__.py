"""Past one machine: cluster workers on NATS JetStream (partitions leased through its key-value store)."""
