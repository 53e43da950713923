"""Lambda entry points: parse, call domain code, shape the response."""
