"""The servers the gateway overhead benchmark starts: the fake upstream, the bare
passthrough, the Reef gateway and the LiteLLM proxy, each a child process in its own
process group on loopback, stopped by ``ChildProcesses.stop_all``.

LiteLLM lives in its own virtual environment, ``bench/.venv-litellm``, created on
first use so that its pins never touch the project's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LITELLM_VERSION = "1.106.12"  # exists on PyPI; never 1.107.0 (a compromised release)
LITELLM_VENV = REPO / "bench" / ".venv-litellm"
_INSTALL_TIMEOUT_SECONDS = 900
_LOOPBACK = "127.0.0.1"
_NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Server:
    """A started server: its name, ``/v1`` base URL, process and log file."""

    name: str
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def chat_url(self) -> str:
        """Where chat completions are posted."""
        return self.base_url + "/chat/completions"


class StartError(RuntimeError):
    """A server did not come up; the message says why (with its log's tail)."""


class ChildProcesses:
    """Every process the benchmark started, each the leader of its own group."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._started: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start ``argv`` in a new session (so signals reach its whole tree)."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self._started.append(process)
        return process, log_path

    def stop_all(self) -> None:
        """SIGINT each group, then SIGTERM, then SIGKILL; newest first."""
        for process in reversed(self._started):
            for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                if process.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(grace)
        self._started.clear()


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as probe:
        probe.bind((_LOOPBACK, 0))
        return int(probe.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """Our environment without proxies or REEF_* overrides, plus ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.lower().endswith("_proxy") and not key.startswith("REEF_")
    }
    return {**env, **_NO_PROXY, **extra}


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def wait_ready(process: subprocess.Popen[bytes], log_path: Path, url: str, limit: float) -> None:
    """Poll ``url`` until it answers 200; raises ``StartError`` on exit or timeout."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(f"exited with {process.returncode}:\n{_tail(log_path)}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            _OPENER.open(url, timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.2)
    raise StartError(f"not ready after {limit:.0f} s:\n{_tail(log_path)}")


def start_upstream(children: ChildProcesses) -> Server:
    """The fake OpenAI-compatible model server (``tests.fakes.upstream``)."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.fakes.upstream", "--port", str(port)]
    process, log = children.spawn("upstream", argv, child_env())
    base = f"http://{_LOOPBACK}:{port}/v1"
    wait_ready(process, log, base + "/models", 30)
    return Server("direct", base, process, log)


def start_passthrough(children: ChildProcesses, upstream: str, workers: int = 1) -> Server:
    """``bench/passthrough.py``: forwarding with no capture, in ``workers`` processes."""
    port = free_port()
    script = str(REPO / "bench" / "passthrough.py")
    argv = [sys.executable, script, "--port", str(port), "--upstream", upstream]
    argv += ["--workers", str(workers)]
    process, log = children.spawn("passthrough", argv, child_env())
    wait_ready(process, log, f"http://{_LOOPBACK}:{port}/healthz", 30)
    return Server("passthrough", f"http://{_LOOPBACK}:{port}/v1", process, log)


# Budgets and rate limits set far above what a bench spends, so nothing is refused: a
# global and a scenario budget (hour, day and month windows; ``budgets.ledger: memory``,
# the default on SQLite) and a scenario rate limit (requests and tokens per minute).
SPEND_CONFIG = (
    "budgets: {global: [{window: month, money: 1.0e9}], scenarios: {default: "
    "[{window: hour, tokens: 1000000000}, {window: day, money: 1.0e8}]}}\n"
    "rate_limits: {scenarios: {default: {requests_per_minute: 100000000, "
    "tokens_per_minute: 1000000000}}}\n"
)
SPEND_PRICES = "{input_per_mtok: 2.5, output_per_mtok: 10.0}"  # a price for the model


def start_reef(
    children: ChildProcesses,
    upstream: str,
    workdir: Path,
    name: str = "reef",
    durability: str = "sync",
    workers: int = 1,
    spend: bool = False,
    store_url: str | None = None,
    capture: bool = True,
) -> tuple[Server, Path]:
    """The Reef gateway with capture on and ``durability`` (``store.durability``), in
    ``workers`` gateway processes (``server.workers``); also its SQLite path. ``name``
    names its log and its results (one per gateway when a bench runs several). With
    ``spend``: a price for the model, budgets and rate limits (``SPEND_CONFIG``).
    ``store_url`` (``store.url``) puts the records elsewhere, e.g. in PostgreSQL; by
    default they go to that SQLite path, ``workdir/reef.db``. ``capture`` false: the
    ``default`` scenario records nothing (``scenarios.<s>.capture``), the same gateway
    otherwise."""
    port = free_port()
    database = workdir / "reef.db"
    config = workdir / "reef.yaml"
    prices = f", prices: {{fake-model: {SPEND_PRICES}}}" if spend else ""
    url = store_url or f"sqlite:///{database}"
    config.write_text(
        f"home: {workdir / 'home'}\n"
        f"server: {{port: {port}, workers: {workers}}}\n"
        f'store: {{url: "{url}", durability: {durability}}}\n'
        f"upstreams: {{fake: {{type: openai, base_url: {upstream!r}, model: fake-model"
        f"{prices}}}}}\n"
        + (SPEND_CONFIG if spend else "")
        + ("" if capture else "scenarios: {default: {capture: false}}\n")
    )
    argv = [sys.executable, "-m", "reef", "serve", "-c", str(config), "--log-level", "WARNING"]
    process, log = children.spawn(name, argv, child_env())
    wait_ready(process, log, f"http://{_LOOPBACK}:{port}/healthz", 60)
    return Server(name, f"http://{_LOOPBACK}:{port}/v1", process, log), database


def ensure_litellm() -> Path:
    """The ``litellm`` executable of ``bench/.venv-litellm``, installed if missing.

    Raises ``StartError`` when the virtual environment cannot be made.
    """
    python = LITELLM_VENV / "bin" / "python"
    executable = LITELLM_VENV / "bin" / "litellm"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"]
    if executable.exists():
        found = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        if found.stdout.strip() == LITELLM_VERSION:
            return executable
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(LITELLM_VENV)],
        [str(python), "-m", "pip", "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired as exc:
            raise StartError(f"{' '.join(step)} took over {exc.timeout:.0f} s") from exc
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise StartError(f"{' '.join(step)} failed: {' / '.join(last)}")
    return executable


def start_litellm(
    children: ChildProcesses, upstream: str, workdir: Path, master_key: str
) -> Server:
    """The LiteLLM proxy, one uvicorn worker, no database, callbacks or telemetry."""
    executable = ensure_litellm()
    port = free_port()
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fake-model\n"
        "    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: {upstream}\n"
        "      api_key: sk-fake-upstream\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  num_retries: 0\n"
        "general_settings:\n"
        "  disable_spend_logs: true\n"
        "  disable_error_logs: true\n"
        "  store_model_in_db: false\n"
    )
    env = child_env(
        LITELLM_MASTER_KEY=master_key,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_TELEMETRY="False",
        LITELLM_LOG="ERROR",
    )
    env.pop("DATABASE_URL", None)
    argv = [str(executable), "--config", str(config), "--host", _LOOPBACK,
            "--port", str(port), "--num_workers", "1"]  # fmt: skip
    process, log = children.spawn("litellm", argv, env)
    wait_ready(process, log, f"http://{_LOOPBACK}:{port}/health/liveliness", 120)
    return Server("litellm", f"http://{_LOOPBACK}:{port}/v1", process, log)
