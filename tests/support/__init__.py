"""Fixture modules the tests share (declared apps for the registry's tests)."""
