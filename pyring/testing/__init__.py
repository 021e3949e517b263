"""Helpers for pyring's own tests: the sim device (``pyring.testing.sim``). Not for users."""
