"""Tests of the repository as a whole: the import layout of its packages and of its tests."""
