"""`dsv4bench sweep` (being built)."""
