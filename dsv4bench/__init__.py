"""dsv4bench: load-test and correctness audit for LLM servers under agentic load."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dsv4bench")  # pyproject.toml's, the one place the version is written
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
