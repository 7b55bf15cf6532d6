"""``reef eval run``: compare two releases (or candidates) on a suite, by hand;
``reef eval show``: a candidate's gate decision and where its evidence came from.

Both arms answer every item through a running gateway (pinned, purpose ``eval``), the
answers are scored, the gate's rule gives a verdict, and a report is written: markdown,
JSON and a PNG of per-item differences. The comparison is stored like the gate's (it
shows on the dashboard) but publishes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

eval_app = typer.Typer(help="Evaluate releases and candidates.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]


@eval_app.command("run")
def run_command(
    scenario: Annotated[str, typer.Option(help="The scenario both arms belong to.")],
    candidate: Annotated[str, typer.Option(help="Release or candidate id to evaluate.")],
    suite: Annotated[
        list[Path], typer.Option(help="Suite file (JSONL or YAML); repeat for several.")
    ],
    against: Annotated[
        str | None, typer.Option(help="Release or candidate to compare with (default: head).")
    ] = None,
    scorer: Annotated[
        str, typer.Option(help="Scorer for items that name none (a registered type).")
    ] = "normalized_exact",
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Answers per item and arm.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Calls in flight.")] = 4,
    min_items: Annotated[int, typer.Option(min=1, help="Fewest items for a verdict.")] = 20,
    min_improvement: Annotated[float, typer.Option(help="Smallest mean gain to pass.")] = 0.01,
    method: Annotated[
        str,
        typer.Option(help="sequential (anytime-valid; may say undecided) or bootstrap."),
    ] = "sequential",
    max_tokens: Annotated[int, typer.Option(min=1, help="Reply length cap.")] = 256,
    out: Annotated[Path, typer.Option(help="Directory for the report.")] = Path("reef-eval"),
    gateway: Annotated[
        str | None, typer.Option(help="Gateway base URL (default: from the config).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="REEF_API_KEY", help="Key, when the gateway needs one.")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Compare CANDIDATE with AGAINST on SUITE and write report.md, report.json and
    differences.png under OUT."""
    if method not in ("sequential", "bootstrap"):
        raise typer.BadParameter(
            f"must be sequential or bootstrap, got {method!r}", param_hint="--method"
        )
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from reef.cli.releases import cli_actor
    from reef.cli.stores import check_scenario, open_existing_database
    from reef.config import load_settings
    from reef.core.errors import NotFoundError
    from reef.evaluation import (
        EvaluationStore,
        GateRule,
        GatewayTarget,
        ScorerContext,
        ScorerRegistry,
        collect_answers,
        decide_results,
        load_suite,
        score_answers,
        write_report,
    )
    from reef.experience import Redactor
    from reef.releases import ReleaseChain

    settings = load_settings(config)
    database = open_existing_database(settings)
    console = Console(stderr=True)
    try:
        check_scenario(settings, database, scenario)
        chain = ReleaseChain(database)
        if against is None:
            head = chain.head(scenario)
            if head is None:
                raise NotFoundError(f"scenario {scenario!r} has no release to compare against")
            against = head.id
        items = [item for path in suite for item in load_suite(path)]
        key = api_key or (
            settings.evaluation.api_key.get_secret_value() if settings.evaluation.api_key else None
        )
        target = GatewayTarget(
            base_url=(gateway or settings.gateway_url()).rstrip("/"),
            scenario=scenario,
            api_key=key,
            concurrency=concurrency,
        )
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("answers", total=len(items) * repeats * 2)
            answers = collect_answers(
                target,
                items,
                {"candidate": candidate, "baseline": against},
                repeats=repeats,
                defaults={"max_tokens": max_tokens, "temperature": 0.0},
                progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
        rule = GateRule.model_validate(
            {"min_items": min_items, "min_improvement": min_improvement, "method": method}
        )
        results = score_answers(
            items, answers, {"type": scorer}, ScorerRegistry(), ScorerContext(), 48
        )
        decision = decide_results(results, [], rule, items)
        meta = {
            "scenario": scenario,
            "candidate": candidate,
            "baseline": against,
            "suites": [str(path) for path in suite],
            "repeats": repeats,
            "scorer": scorer,
            "model_calls": sum(answer.attempts for answer in answers),
        }
        evaluations = EvaluationStore(database, Redactor(settings.capture.redact_patterns))
        evaluation_id = evaluations.start(scenario, candidate, against, items, meta, cli_actor())
        evaluations.add_results(evaluation_id, results)
        evaluations.finish(evaluation_id, decision)
        paths = write_report(
            out,
            title=f"{scenario}: {candidate} vs {against}",
            meta={**meta, "evaluation_id": evaluation_id},
            decision=decision,
            results=results,
        )
    finally:
        database.close()
    console.print(f"[bold]{decision.summary()}[/bold]")
    for kind, path in sorted(paths.items()):
        typer.echo(f"{kind}: {path}")


@eval_app.command("show")
def show_command(
    candidate_id: Annotated[str, typer.Argument(help="The candidate to describe.")],
    config: ConfigOption = None,
) -> None:
    """Show a candidate's gate decision: verdict and reasons, where the evidence came
    from (by suite, trust level and author, with the leave-one-author-out checks) and the
    feedback its learning job screened out."""
    from reef.cli.stores import open_existing_database
    from reef.config import load_settings
    from reef.evaluation import candidate_summary
    from reef.releases import ReleaseChain

    database = open_existing_database(load_settings(config))
    try:
        candidate = ReleaseChain(database).get_candidate(candidate_id)
    finally:
        database.close()
    for line in candidate_summary(candidate.id, candidate.state, candidate.evidence):
        typer.echo(line)
