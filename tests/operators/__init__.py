"""Tests of the DP algorithms in operators/: ToPS and its hierarchy, noise, selection, columnar rows, holdouts,
local randomizers, categorical oracles, ranges and baselines."""
