"""Fixtures and checks shared by the test suite and the `ddtree selfcheck` stage (importable from an install)."""
