"""DSV4-mini: the bundled inference engine."""
