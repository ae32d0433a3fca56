"""Helpers shared by the tests: settings for each backend and a real server on loopback."""
