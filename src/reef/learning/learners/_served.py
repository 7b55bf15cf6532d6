"""Training a prompt as the candidate will serve it (shared by every model learner).

A ``harness: managed`` scenario's records hold the client's request without the harness:
the gateway renders the serving release's system text, rules, skills, memory, demos and
tools into each request on its way upstream, and records what the client sent. A model
trained on the records as they are then meets, at serving time, a prompt it never saw
(on a label map, an adapter that fit its training set to a loss of 0.011 answered 2% of
held-out items right as served). So a model learner renders the candidate's harness into
every prompt it trains on, the way the gateway will.

``render_harness`` (every model learner's setting) decides: ``None`` (the default) renders
when the scenario's harness is ``managed``; ``true`` always; ``false`` never. ``false``
is right when the records already hold what the model serves with: a ``harness: client``
scenario, whose clients install the harness and send it with every request (recorded as
sent), which is what the default does for them; or a recipe that means to train the bare
prompt on purpose (a model meant to serve without a harness).

The candidate's harness is the head's with the components of the recipe's earlier
learners in it (the worker hands each learner the candidate so far as its head), so a
harness learner listed after a model learner is not seen by its training: list harness
learners first.

``demos`` (every model learner's setting) decides what becomes of the harness's few-shot
demos when the learner renders it. ``drop`` (the default; ``distill`` keeps them, as the
release's harness prompts its teacher too) trains every prompt without them, and the
candidate serves without them too (the learner returns the harness minus its demos), so
the adapter is served exactly as it trained. ``keep`` trains and serves
with them. Measured with ``bench/learning.py --compare-recipes`` (docs/benchmarks.md,
"``fewshot`` then ``sft`` for a ``harness: managed`` scenario"):
on the label map, ``fewshot`` then ``sft`` served with two fixed demos scored 73%
held-out against 98% for the adapter alone, and which two demos it trained under moved
it between 58% and 98%; an adapter trained on the records has learned what the demos
show, and each demo lengthens every request. DSPy's ``BootstrapFinetune`` makes the same
choice (``exclude_demos``).
"""

from __future__ import annotations

from typing import Any

from reef.harness import Harness, render_openai
from reef.learning.base import LearnerContext
from reef.learning.learners._examples import text_messages, tool_messages
from reef.learning.learners._harness import head_bundle, replace_fields, store_bundle
from reef.learning.learners._model import ModelLearnerSettings


def renders_harness(context: LearnerContext, setting: bool | None) -> bool:
    """Whether a model learner with ``render_harness: setting`` trains under the
    candidate's harness: the setting when given, else whether the scenario's harness is
    ``managed`` (``context.harness_mode``)."""
    if setting is not None:
        return setting
    return context.harness_mode == "managed"


def served_harness(context: LearnerContext, settings: ModelLearnerSettings) -> Harness | None:
    """The harness a model learner renders into its prompts (module docstring): the
    candidate's so far (without its demos for ``demos: drop``), or None when it trains on
    the records as they are."""
    if not renders_harness(context, settings.render_harness):
        return None
    harness = head_bundle(context).harness
    if settings.demos == "drop" and harness.examples:
        return harness.model_copy(update={"examples": []})
    return harness


def served_harness_output(context: LearnerContext, settings: ModelLearnerSettings) -> str | None:
    """The digest of the harness the candidate must serve for a model learner's training
    to hold (``LearnerOutput.harness``): the candidate's without its demos when the
    learner rendered it with ``demos: drop`` and it has demos; else None (unchanged)."""
    if settings.demos != "drop" or not renders_harness(context, settings.render_harness):
        return None
    bundle = head_bundle(context)
    if not bundle.harness.examples:
        return None
    # Shown with the job's metrics: the demos an earlier learner chose went unserved.
    context.metrics.record("demos_dropped", float(len(bundle.harness.examples)))
    return store_bundle(context, replace_fields(bundle, examples=[]))


def served_prompt(
    harness: Harness | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``messages`` and ``tools`` as the gateway sends them upstream under ``harness``
    (``reef.harness.render_openai``: system text, demos, harness tools), in the form the
    trainers take (:func:`text_messages`, or :func:`tool_messages` when tools are
    offered). ``harness`` None: unchanged."""
    if harness is None:
        return messages, tools
    body = render_openai(harness, {"messages": messages, "tools": tools})
    rendered_tools = list(body.get("tools") or [])
    if tools or rendered_tools:
        return tool_messages(body["messages"]), rendered_tools
    return text_messages(body["messages"]), []
