"""`dsv4bench proxy` (being built)."""
