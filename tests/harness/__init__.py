"""Test harnesses shared by several test files: fault injection, HTTP events, fuzz bodies."""
