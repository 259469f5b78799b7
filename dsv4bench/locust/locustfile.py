"""The locustfile `dsv4bench locust` hands Locust (`-f`): the agent user, the load shape chosen
by `--shape`, the dsv4bench tab of the web UI, and the listeners that make each test a run
folder (lifecycle.py). Run through `dsv4bench locust`, which writes the run's plan; Locust
alone cannot start it without one.
"""

from __future__ import annotations

import logging

from locust import events
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment

from dsv4bench.locust import plan as _plan
from dsv4bench.locust.lifecycle import Lifecycle
from dsv4bench.locust.shapes import selected_shape
from dsv4bench.locust.user import AgentUser

__all__ = ["AgentUser"]

# NOTE: httpx logs every request at INFO, which would drown Locust's own log.
logging.getLogger("httpx").setLevel(logging.WARNING)

LoadShape = selected_shape()  # Locust plays the locustfile's one LoadTestShape subclass; None: none


@events.init_command_line_parser.add_listener
def _arguments(parser: LocustArgumentParser, **_: object) -> None:
    _plan.add_arguments(parser)


@events.init.add_listener
def _init(environment: Environment, **_: object) -> None:
    lifecycle = Lifecycle(environment)
    environment.events.test_start.add_listener(lifecycle.test_start)
    environment.events.test_stop.add_listener(lifecycle.test_stop)
    environment.events.quitting.add_listener(lifecycle.quitting)
    if environment.web_ui is not None:
        from dsv4bench.locust import web_guard, web_tab

        # The guard first: its before_request refuses other sites' requests before any view runs.
        guard = web_guard.install(environment)
        web_tab.install(environment, lifecycle, guard)
