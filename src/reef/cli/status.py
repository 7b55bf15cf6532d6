"""``reef status``: what a running gateway serves, for a person (or ``--json``).

Reads the admin API (``/reef/status``, ``/reef/scenarios`` and each scenario's newest
jobs) and prints the capture counters, one row per scenario (what it serves, its head,
since when, canary, error) and the newest jobs, with times in local ISO form. Touches
no store: everything comes from the gateway.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from reef.core.errors import PermissionDeniedError, ReefError, UnauthenticatedError

JOBS_PER_SCENARIO = 5
_KEY_HINT = "pass an admin key with --api-key KEY or the REEF_API_KEY environment variable"

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]


class GatewayUnreachableError(ReefError):
    """Nothing answers at the gateway URL, or it answers something that is not Reef."""


def fetch(base_url: str, path: str, api_key: str | None) -> Any:
    """``GET base_url + path`` as JSON. Raises ``UnauthenticatedError`` (401) and
    ``PermissionDeniedError`` (403) naming ``--api-key``/``REEF_API_KEY``, and
    ``GatewayUnreachableError`` for no answer or any other status."""
    request = urllib.request.Request(base_url + path)  # noqa: S310 (the gateway's or engine's own http URL)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (the gateway's or engine's own http URL)
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = _error_message(exc)
        if exc.code == 401:
            given = "refused the key given" if api_key else "needs an admin key"
            raise UnauthenticatedError(f"{base_url} {given} (401): {_KEY_HINT}") from exc
        if exc.code == 403:
            raise PermissionDeniedError(
                f"{base_url} answered 403 ({detail}): reef status needs a key with role "
                f"admin; {_KEY_HINT}"
            ) from exc
        raise GatewayUnreachableError(f"{base_url}{path} answered {exc.code}: {detail}") from exc
    except urllib.error.URLError as exc:
        raise GatewayUnreachableError(
            f"no gateway at {base_url} ({exc.reason}); is `reef serve` running? "
            "Pick another with --url or server.port in the config"
        ) from exc
    except (ValueError, OSError) as exc:  # not JSON, or the connection broke mid-answer
        raise GatewayUnreachableError(f"{base_url}{path} gave no readable answer: {exc}") from exc


def _error_message(exc: urllib.error.HTTPError) -> str:
    body = exc.read().decode(errors="replace")
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return " ".join(body.split())[:200] or exc.reason


def when(value: float | str | None) -> str:
    """A time as local ``YYYY-MM-DD HH:MM:SS±HH:MM``, from epoch seconds or ISO 8601."""
    if value is None:
        return "-"
    if isinstance(value, str):
        moment = datetime.fromisoformat(value)
    else:
        moment = datetime.fromtimestamp(value).astimezone()
    return moment.astimezone().isoformat(sep=" ", timespec="seconds")


def gather(base_url: str, api_key: str | None) -> dict[str, Any]:
    """``/reef/status`` with the chain's heads (``heads``) and each scenario's newest
    jobs (``jobs``: scenario → list, newest first)."""
    status: dict[str, Any] = fetch(base_url, "/reef/status", api_key)
    heads = fetch(base_url, "/reef/scenarios", api_key)["data"]
    jobs = {
        head["name"]: fetch(
            base_url,
            f"/reef/scenarios/{urllib.parse.quote(head['name'], safe='')}/jobs"
            f"?limit={JOBS_PER_SCENARIO}",
            api_key,
        )["data"]
        for head in heads
    }
    return {**status, "heads": heads, "jobs": jobs}


def _capture_line(capture: dict[str, Any]) -> str:
    return (
        f"capture: {capture['durability']} durability, {capture['written_total']} written, "
        f"{capture['queue_depth']} queued, {capture['dropped_total']} dropped, "
        f"{capture['failed_total']} failed"
    )


def _canary(canary: dict[str, Any] | None) -> str:
    if canary is None:
        return "-"
    return f"{canary['candidate_id']} at {canary['fraction']:.0%} ({canary['state']})"


def _scenarios_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="scenarios")
    for name in ("scenario", "state", "serving", "head", "releases", "since", "canary"):
        table.add_column(name, no_wrap=name in ("serving", "head"))
    table.add_column("error")
    heads = {head["name"]: head for head in data["heads"]}
    for name in sorted(set(heads) | set(data["scenarios"])):
        active = data["scenarios"].get(name, {})
        head = heads.get(name, {})
        head_id = head.get("head_release_id") or active.get("head_release_id")
        serving = active.get("serving_release_id")
        table.add_row(
            name,
            active.get("state", "not loaded"),
            serving or "-",
            "same" if head_id is not None and head_id == serving else head_id or "-",
            str(head.get("releases", "-")),
            when(active.get("activated_at")),
            _canary(active.get("canary")),
            active.get("error") or "",
        )
    return table


def _jobs_table(jobs: dict[str, list[dict[str, Any]]]) -> Any:
    from rich.table import Table

    table = Table(title=f"jobs (newest {JOBS_PER_SCENARIO} per scenario)")
    names = ("scenario", "id", "state", "progress", "updated", "message", "candidate", "cost")
    for name in names:
        table.add_column(name, no_wrap=name == "id")
    for scenario, found in sorted(jobs.items()):
        for job in found:
            progress = job.get("progress")
            table.add_row(
                scenario,
                job["id"],
                job["state"],
                "" if progress is None else f"{progress:.0%}",
                when(job.get("updated_at")),
                job.get("error") or job.get("message") or "",
                job.get("candidate_id") or "",
                job_cost(job.get("result")),
            )
    return table


def spend_text(spend: dict[str, Any] | None) -> str:
    """One learning tally (``SpendTally.as_dict``) in a few words: ``12 calls, 3400
    tok, 0.0123, 20.0 cpu min``; empty when it spent nothing."""
    if not spend:
        return ""
    parts = []
    if spend.get("model_calls"):
        calls = spend["model_calls"]
        parts.append(f"{calls} call{'' if calls == 1 else 's'}, {spend.get('tokens', 0)} tok")
        money = spend.get("money")
        unpriced = spend.get("unpriced_calls") or 0
        if money is not None:
            parts.append(f"{money:.4f}" + (f" (+{unpriced} unpriced)" if unpriced else ""))
        elif unpriced:
            parts.append("unpriced")
    for device in ("cpu", "gpu"):
        minutes = spend.get(f"{device}_minutes") or 0
        if minutes:
            parts.append(f"{minutes:.1f} {device} min")
    return ", ".join(parts)


def job_cost(result: dict[str, Any] | None) -> str:
    """What a finished job cost (its ``cost``), its gate decision's share after
    ``gate:``; empty for a job without a tally."""
    if not isinstance(result, dict):
        return ""
    text = spend_text(result.get("cost"))
    gate = result.get("gate")
    gate_spend = gate.get("cost", {}).get("spend") if isinstance(gate, dict) else None
    gate_text = spend_text(gate_spend)
    if gate_text:
        text = f"{text} (gate: {gate_text})"
    return text


def print_status(base_url: str, data: dict[str, Any]) -> None:
    """The human-readable form of ``gather``'s answer."""
    from reef.cli.releases import print_table

    typer.echo(f"Reef gateway at {base_url}")
    typer.echo(_capture_line(data["capture"]))
    isolation = data.get("tool_isolation")
    if isolation is not None:
        typer.echo(_isolation_line(isolation))
    typer.echo(
        f"activation: {data['flips_total']} flips, {data['failures_total']} failures, "
        f"{data['canary_failures_total']} canary failures"
    )
    loaded = [
        f"{upstream}: {adapter} ({in_use} in use)"
        for upstream, adapters in sorted(data["adapters"].items())
        for adapter, in_use in sorted(adapters.items())
    ]
    typer.echo("adapters: " + ("; ".join(loaded) if loaded else "none loaded"))
    checkpoints = [
        f"{upstream}: {name} ({in_use} in use)"
        for upstream, names in sorted(data.get("checkpoints", {}).items())
        for name, in_use in sorted(names.items())
    ]
    if checkpoints:
        typer.echo("checkpoints: " + "; ".join(checkpoints))
    for upstream, weights in sorted(data.get("in_place", {}).items()):
        typer.echo(_in_place_line(upstream, weights))
    for upstream, cache in sorted(data.get("adapter_cache", {}).items()):
        typer.echo(_adapter_cache_line(upstream, cache))
    for line in _spend_lines(data.get("spend")):
        typer.echo(line)
    for line in _distill_lines(data.get("distill")):
        typer.echo(line)
    print_table(_scenarios_table(data))
    if any(data["jobs"].values()):
        print_table(_jobs_table(data["jobs"]))
    else:
        typer.echo("jobs: none")


def _distill_lines(distill: dict[str, Any] | None) -> list[str]:
    """Each distilled scenario's student share, escalation rate and teacher calls."""
    return [
        f"distill {name}: student share {row['student_share']:g}, escalation rate "
        f"{row['escalation_rate']:.1%}, teacher calls {row['teacher_calls_last_hour']} in "
        f"the last hour ({row['teacher_calls_total']} since start)"
        for name, row in sorted((distill or {}).items())
    ]


def _spend_lines(spend: dict[str, Any] | None) -> list[str]:
    """Each budget's spend in its window, what this gateway served since it started
    (cost per scenario and purpose) and the requests it refused (per budget or rate
    limit)."""
    if not spend:
        return []
    lines = []
    for budget in spend["budgets"]:
        parts = []
        if budget["money_limit"] is not None:
            parts.append(f"money {budget['money']:.4f} of {budget['money_limit']:g}")
        if budget["tokens_limit"] is not None:
            parts.append(f"tokens {budget['tokens']} of {budget['tokens_limit']}")
        lines.append(
            f"budget {budget['budget']} ({budget['window']}): {', '.join(parts)}; "
            f"resets {budget['resets']}"
        )
    served = [
        f"{row['scenario']}/{row['purpose']} {row['cost']:.4f} ({row['tokens']} tokens"
        + (f", {row['unpriced']} unpriced)" if row["unpriced"] else ")")
        for row in spend["served"]
    ]
    if served:
        lines.append("spend since start: " + "; ".join(served))
    refused = [f"{row['limit']}/{row['window']} {row['count']}" for row in spend.get("refused", ())]
    if refused:
        lines.append("refused since start: " + "; ".join(refused))
    return (
        lines
        + _release_lines(spend)
        + _key_lines(spend)
        + _learning_budget_lines(spend)
        + _learning_lines(spend)
    )


def _release_lines(spend: dict[str, Any]) -> list[str]:
    """The cost of each release (its records' costs) since ``releases_since``."""
    releases = [
        f"{row['scenario']}@{row['release'] or 'none'} {row['cost']:.4f} "
        f"({row['requests']} requests"
        + (f", {row['unpriced']} unpriced)" if row["unpriced"] else ")")
        for row in spend.get("releases", ())
    ]
    if not releases:
        return []
    return [f"cost per release since {spend['releases_since'][:10]}: " + "; ".join(releases)]


def _key_lines(spend: dict[str, Any]) -> list[str]:
    """The cost of each scenario, key and purpose (its records' costs) since
    ``releases_since``."""
    keys = [
        f"{row['scenario']}/{row['key'] or 'no key'}/{row['purpose']} {row['cost']:.4f} "
        f"({row['requests']} requests"
        + (f", {row['unpriced']} unpriced)" if row["unpriced"] else ")")
        for row in spend.get("keys", ())
    ]
    if not keys:
        return []
    since = spend["releases_since"][:10]
    return [f"cost per scenario, key and purpose since {since}: " + "; ".join(keys)]


_LEARNING_KINDS = ("calls", "tokens", "money", "cpu_minutes", "gpu_minutes")


def _learning_budget_lines(spend: dict[str, Any]) -> list[str]:
    """Each learning budget's spend in its current window against its limits."""
    lines = []
    for row in spend.get("learning_budgets", ()):
        parts = []
        for kind in _LEARNING_KINDS:
            limit = row.get(f"{kind}_limit")
            if limit is not None:
                spent = row[kind]
                shown = f"{spent:.4f}" if kind == "money" else f"{spent:g}"
                parts.append(f"{kind.replace('_', ' ')} {shown} of {limit:g}")
        lines.append(
            f"learning budget {row['budget']} ({row['window']}): {', '.join(parts)}; "
            f"resets {row['resets']}"
        )
    return lines


def _learning_lines(spend: dict[str, Any]) -> list[str]:
    """What each recent learning job cost, and its gate decision's share."""
    lines = []
    for job in spend.get("learning", ()):
        text = spend_text(job["cost"]) or "nothing"
        gate = job.get("gate")
        if gate is not None:
            text += f"; gate ({gate['action']}): {spend_text(gate['spend']) or 'nothing'}"
        lines.append(f"learning job {job['job_id']} ({job['scenario']}, {job['outcome']}): {text}")
    return lines


def _isolation_line(isolation: dict[str, Any]) -> str:
    """The OS boundary the python environment's tools get, or why there is none."""
    if isolation["boundary"] == "none":
        return f"tool isolation: NONE, tools run unconfined: {isolation['detail']}"
    return f"tool isolation: {isolation['boundary']} ({isolation['detail']})"


def _adapter_cache_line(upstream: str, cache: dict[str, Any]) -> str:
    """One upstream's adapter cache: resident and needed against its slots, evictions,
    and the cliff warning."""
    slots = cache["adapter_slots"]
    gpu, cpu = slots.get("max_loras"), slots.get("max_cpu_loras")
    held = "slots unknown" if gpu is None else f"{gpu} slots"
    if cpu is not None:
        held += f" (+{cpu} in host memory)"
    line = (
        f"adapter cache ({upstream}): {len(cache['resident'])} resident, "
        f"{len(cache['needed'])} needed active, {held}, {cache['evictions_total']} evictions"
    )
    if cache.get("cliff"):
        line += " - CACHE CLIFF: more adapters need to be active than the upstream holds"
    if cache.get("error"):
        line += f" (last check failed: {cache['error']})"
    return line


def _in_place_line(upstream: str, weights: dict[str, Any]) -> str:
    """One upstream that reloads its weights in place: what it holds, what runs on it."""
    resident = weights.get("resident")
    holds = (
        "weights not confirmed yet"
        if resident is None
        else "the base model"
        if resident == "base"
        else f"checkpoint {str(resident)[:19]}"
    )
    line = (
        f"in place ({upstream}): holds {holds}, {weights.get('in_flight', 0)} in flight, "
        f"{weights.get('waiting', 0)} waiting, {weights.get('reloads', 0)} reloads"
    )
    return line + (", swapping now" if weights.get("swapping") else "")


def status_command(
    url: Annotated[
        str | None, typer.Option(help="Gateway URL (default: from the config's server section).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="REEF_API_KEY", help="Admin key, if keys are configured.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    config: ConfigOption = None,
) -> None:
    """Show what a running gateway serves, per scenario.

    Per scenario the serving release, head and canary; capture counters; loaded
    adapters; the newest learning jobs."""
    if url is None:
        from reef.config import load_settings

        url = f"http://127.0.0.1:{load_settings(config).server.port}"
    base_url = url.rstrip("/")
    data = gather(base_url, api_key)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_status(base_url, data)
