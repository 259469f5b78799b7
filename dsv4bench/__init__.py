"""dsv4bench: load-test and correctness audit for LLM servers under agentic load."""

__version__ = "0.1.0"
