"""Benchmarks of flowsvc: a reusable harness, a bare hello-world baseline and the scenarios."""
