"""Tests of the daemon in-process and on stdin: intake, stream kinds, phase log, hostile lines, start refusals."""
