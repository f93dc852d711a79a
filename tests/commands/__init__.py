"""Tests of the offline commands: replay, evaluate, simulate, query, compare, state and their inputs."""
