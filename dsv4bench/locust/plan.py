"""What every agent user of a Locust process plays: the run's RunConfig, the server's facts and
the reproduce line, handed over by `dsv4bench locust` as one custom Locust argument
(`--dsv4bench-plan`, JSON), which Locust's master also forwards to its workers with every
spawn, so a worker on another machine plays what its master was told. The settings a user may
change per test in the web UI (scenario, max turns, thinking, seed) are custom arguments of
their own, shown there.

The API key never travels in the plan: each process reads it from DSV4BENCH_API_KEY.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bench.agents import FAMILIES, MIXED
from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.harness.session import SessionConfig

PLAN_ARG = "--dsv4bench-plan"
API_KEY_ENV = "DSV4BENCH_API_KEY"

# The settings the web UI shows (Locust's custom parameters), by RunConfig field.
UI_SETTINGS = {
    "scenario": "--scenario",
    "max_turns": "--max-turns",
    "thinking": "--thinking",
    "seed": "--seed",
}


def add_arguments(parser: Any) -> None:
    """Locust's `init_command_line_parser`: the plan (hidden) and the per-test settings."""
    parser.add_argument(
        PLAN_ARG,
        type=str,
        default="",
        include_in_web_ui=False,
        help="What dsv4bench's agent users play (JSON; `dsv4bench locust` writes it).",
    )
    group = parser.add_argument_group("dsv4bench", "the agent sessions (dsv4bench locust --help)")
    group.add_argument(
        "--scenario", type=str, default=RunConfig.scenario, help=f"Scenario family: {', '.join([MIXED, *FAMILIES])}."
    )
    group.add_argument("--max-turns", type=int, default=SessionConfig.max_turns, help="Turns per session at most.")
    group.add_argument(
        "--thinking", type=str, default="false", choices=["false", "true"], help="Thinking mode on the chat template."
    )
    group.add_argument(
        "--seed", type=int, default=RunConfig.seed, help="Run seed: session i plays the task seeded from it."
    )


@dataclass(frozen=True)
class Plan:
    """One test's settings, as the users of this process read them at its start."""

    config: RunConfig
    model: str
    facts: dict[str, Any]
    command: str

    @property
    def session_config(self) -> SessionConfig:
        return self.config.session_config(self.model, self.config.context_length or self.facts.get("context_length"))

    def to_arg(self) -> str:
        return json.dumps(
            {"config": self.config.to_json(), "model": self.model, "facts": self.facts, "command": self.command},
            separators=(",", ":"),
        )

    @classmethod
    def from_options(cls, options: Any) -> Plan:
        """The plan in Locust's parsed options, with the web UI's settings applied. ConfigError
        when there is none (the locustfile was started without `dsv4bench locust`) or a
        setting cannot work."""
        text = getattr(options, PLAN_ARG.removeprefix("--").replace("-", "_"), "")
        if not text:
            raise ConfigError("this locustfile runs under `dsv4bench locust`, which hands it the run's plan")
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"the run's plan ({PLAN_ARG}) is not readable: {e}") from None
        settings = {name: getattr(options, name) for name in UI_SETTINGS if getattr(options, name, None) is not None}
        if "thinking" in settings:
            settings["thinking"] = settings["thinking"] == "true"
        return cls.from_json(d, settings)

    @classmethod
    def from_run_info(cls, run_info: dict[str, Any]) -> Plan:
        """The plan a run folder's run.json was written from."""
        return cls.from_json(
            {
                "config": run_info.get("config"),
                "model": run_info.get("model"),
                "facts": run_info.get("server"),
                "command": run_info.get("command"),
            }
        )

    @classmethod
    def from_json(cls, d: Any, settings: dict[str, Any] | None = None) -> Plan:
        """`to_arg`'s JSON read back, `settings` (RunConfig fields) applied over its config."""
        try:
            fields = dict(d["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"the run's plan has no config: {e}") from None
        fields.update(
            {
                "api_key": os.environ.get(API_KEY_ENV) or None,
                "recover_cmd": None,
                "out": Path(fields.get("out") or RunConfig.out),
                "reference": Path(fields["reference"]) if fields.get("reference") else None,
            }
        )
        for key in ("fail_on", "metrics", "kill", "key_hosts"):
            fields[key] = tuple(fields.get(key) or ())
        fields.update(settings or {})
        known = {f.name for f in dataclasses.fields(RunConfig)}
        try:
            config = RunConfig(**{k: v for k, v in fields.items() if k in known})
        except TypeError as e:
            raise ConfigError(f"the run's plan does not fit this version of dsv4bench: {e}") from None
        if config.scenario != MIXED and config.scenario not in FAMILIES:
            raise ConfigError(f"--scenario must be one of {', '.join([MIXED, *FAMILIES])}, not {config.scenario!r}")
        return cls(config, str(d.get("model") or "default"), dict(d.get("facts") or {}), str(d.get("command") or ""))
