"""Empirical privacy audits: lower bounds on eps from sampled outputs on neighbouring inputs."""
