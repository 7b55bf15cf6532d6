"""Environments: where agents act in live episodes, not only in replays of recordings.

Owns: the ``Environment`` contract (``base``: tasks, ``reset`` to the first messages
and the tools offered, ``step`` to tool results, ``score`` with a reason; the episode
limits), checking the model's tool calls (``calls``), task files (``tasks``), the tool
worker that runs a toolset's code in a child process with limits and no network
(``sandbox``, ``worker_main``), the registry over the ``reef.environments``
entry-point group (``registry``), the built-ins ``replay``, ``python`` and ``http``,
an example toolset (``examples.orders``) and the episode runner that plays an
environment against an OpenAI-compatible endpoint (``playing``).
Does not own: serving or recording the model's calls (``gateway``; never imported
here), comparing candidates on episodes (``evaluation``), training on them
(``learning``), recorded trajectories themselves (``experience``, read by ``replay``).
Extend: an environment subclasses ``reef.environments.Environment`` and registers in
the ``reef.environments`` entry-point group; a toolset for the ``python`` environment
is a module registered in ``reef.environment_tools``. YAML picks them by name
(``type:``, ``toolset:``), never by a module path. docs/environments.md has a
complete plugin.
"""

# The face: what other packages import (tests/architecture checks that nothing else is).
from reef.environments.base import (
    TOOL_STATUSES,
    Environment,
    EnvironmentConfig,
    EpisodeError,
    EpisodeLimits,
    Observation,
    Score,
    StepResult,
    ToolCrashed,
    ToolError,
    ToolOutput,
    ToolResult,
    ToolStatus,
    ToolUnrecorded,
    UnknownEnvironmentError,
    default_score,
    final_answer,
)
from reef.environments.calls import (
    ParsedCall,
    cap_output,
    normalize_call,
    parse_call,
    schema_problem,
)
from reef.environments.http_env import HttpEnvironment, HttpEnvironmentConfig
from reef.environments.isolation import (
    Boundary,
    hide_from_tools,
    log_tool_isolation,
    tool_isolation,
)
from reef.environments.many import EpisodeJob, Played, play_episodes, run_episodes
from reef.environments.playing import (
    ChatEndpoint,
    EpisodeResult,
    StopCause,
    TurnTokens,
    play_episode,
    run_episode,
    turn_tokens,
)
from reef.environments.python_env import (
    TOOLSET_GROUP,
    PythonEnvironment,
    PythonEnvironmentConfig,
)
from reef.environments.registry import ENVIRONMENT_GROUP, EnvironmentRegistry, build_environment
from reef.environments.replay import ReplayEnvironment, ReplayEnvironmentConfig
from reef.environments.sandbox import SandboxConfig, ToolWorker
from reef.environments.tasks import (
    EnvironmentSpecError,
    Task,
    TaskCount,
    load_tasks,
    task_from_dict,
)

__all__ = [
    "ENVIRONMENT_GROUP",
    "TOOLSET_GROUP",
    "TOOL_STATUSES",
    "Boundary",
    "ChatEndpoint",
    "Environment",
    "EnvironmentConfig",
    "EnvironmentRegistry",
    "EnvironmentSpecError",
    "EpisodeError",
    "EpisodeJob",
    "EpisodeLimits",
    "EpisodeResult",
    "HttpEnvironment",
    "HttpEnvironmentConfig",
    "Observation",
    "ParsedCall",
    "Played",
    "PythonEnvironment",
    "PythonEnvironmentConfig",
    "ReplayEnvironment",
    "ReplayEnvironmentConfig",
    "SandboxConfig",
    "Score",
    "StepResult",
    "StopCause",
    "Task",
    "TaskCount",
    "ToolCrashed",
    "ToolError",
    "ToolOutput",
    "ToolResult",
    "ToolStatus",
    "ToolUnrecorded",
    "ToolWorker",
    "TurnTokens",
    "UnknownEnvironmentError",
    "build_environment",
    "cap_output",
    "default_score",
    "final_answer",
    "hide_from_tools",
    "load_tasks",
    "log_tool_isolation",
    "normalize_call",
    "parse_call",
    "play_episode",
    "play_episodes",
    "run_episode",
    "run_episodes",
    "schema_problem",
    "task_from_dict",
    "tool_isolation",
    "turn_tokens",
]
