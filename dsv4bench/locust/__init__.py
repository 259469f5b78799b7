"""Locust mode: the agent sessions of `agents` as Locust users (`dsv4bench locust`), headless,
in Locust's web UI, or over Locust's master and workers. Runs on gevent: nothing here shares a
process with the anyio driver; the servers' watch runs in a process of its own
(server_watch.py)."""
