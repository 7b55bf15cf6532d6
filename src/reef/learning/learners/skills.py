"""``skills``: recurring corrections and feedback distilled into skills or memory entries.

1. Signals: training examples with a correction or textual feedback. Their feedback and
   correction text is clustered greedily by token Jaccard (single link, at least
   ``cluster_threshold``); a cluster of at least ``min_support`` examples is recurring.
2. Each recurring cluster becomes one entry. With ``use_reflect`` the reflector is shown
   the cluster's requests and feedback, fenced as quoted data that carries no
   instructions (``_quoting``), and asked for strict JSON ``{"name", "when_to_use",
   "content"}``; anything else (or text that trips the injection scan) falls back to a
   deterministic template listing the feedback and the preferred answers. An entry whose
   template trips the scan is dropped.
   With ``scrub_personal_data`` (the default) the signals are scrubbed of personal data
   (typed placeholders such as ``<EMAIL>``, ``<PHONE>``; ``reef.experience``) before
   clustering, and so is the reflector's entry: nothing a customer wrote about
   themselves reaches a skill that every key of the scenario can download.
3. Citations: every entry names the record ids it came from — a skill in its
   ``description`` ("Learned from records …"), a memory entry at its end — and
   ``orchestration.extra["learned_sources"]`` maps each learned entry to its full list.
4. Learned entries accumulate across runs (a run sees only records not yet consumed):
   a new entry at least ``dedup_threshold`` similar to an earlier learned one replaces
   it and inherits its sources; hand-written skills and memory are never touched. At
   most ``max_skills`` learned entries are kept, the newest first.

Raises ``NoCandidateError`` when no recurring cluster yields an entry.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from reef.experience import scrub_personal_text
from reef.harness import Harness, Skill, scan_for_injection
from reef.learning.base import (
    Learner,
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._errors import NoCandidateError
from reef.learning.learners._examples import scrubbed_example
from reef.learning.learners._harness import head_bundle, replace_fields, store_bundle
from reef.learning.learners._quoting import reflection_messages
from reef.learning.learners._similarity import jaccard, tokens

SOURCES_KEY = "learned_sources"
_MAX_CITED = 20
_STOPWORD_TEXT = (
    "the and for you your with that this are was not but can what how when who why please "
    "should would could from have has had its into about them they their then "
    "than there here just also only very more most some any all one our out use "
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_NAME_CHARS = re.compile(r"[^A-Za-z0-9 _.-]+")

PROMPT = """Several conversations with an AI assistant drew similar feedback; the quoted
data below holds each one's last request and its feedback. Write ONE reusable skill that
teaches the assistant what to do next time.
"""

ANSWER_FORMAT = """Answer with ONLY a JSON object, no prose and no code fences, exactly of
this form:
{"name": "<2-5 word name>", "when_to_use": "<one sentence>", "content": "<the skill>"}
"""


class SkillsConfig(LearnerConfig):
    """Settings of the ``skills`` learner (module docstring)."""

    target: Literal["skills", "memory"] = "skills"
    max_skills: int = Field(default=8, ge=1)
    min_support: int = Field(default=2, ge=1)
    cluster_threshold: float = Field(default=0.3, gt=0.0, le=1.0)
    dedup_threshold: float = Field(default=0.6, gt=0.0, le=1.0)
    use_reflect: bool = True
    max_content_chars: int = Field(default=2000, ge=50)
    scrub_personal_data: bool = True


@dataclass
class Entry:
    """One learned skill or memory entry and the records it cites."""

    name: str
    when_to_use: str
    content: str
    sources: list[str]


class SkillsLearner(Learner):
    """Adds skills (or memory entries) distilled from recurring feedback to the head."""

    type_name: ClassVar[str] = "skills"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = SkillsConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """Distil, deduplicate, cap and store (module docstring); raises ``NoCandidateError``."""
        config = self.config
        assert isinstance(config, SkillsConfig)
        scrubbed: Counter[str] = Counter()
        signals = [e for e in context.batch.train if signal_text(e)]
        if config.scrub_personal_data:
            signals = [scrubbed_example(e, scrubbed) for e in signals]
        clusters = [
            c for c in cluster(signals, config.cluster_threshold) if len(c) >= config.min_support
        ]
        fresh: list[Entry] = []
        dropped = 0
        for index, members in enumerate(clusters):
            context.progress.report(
                index / max(1, len(clusters)), f"distilling cluster {index + 1}"
            )
            entry = distil(members, config, context if config.use_reflect else None, scrubbed)
            if entry is None:
                dropped += 1
            else:
                fresh.append(entry)
        if not fresh:
            raise NoCandidateError(
                f"skills: no recurring feedback ({len(signals)} signals, {len(clusters)} "
                f"clusters of >= {config.min_support}, {dropped} dropped by the scan)"
            )
        bundle = head_bundle(context)
        entries = merge(previous_entries(bundle.harness, config.target), fresh, config)
        harness = apply(bundle.harness, entries, config.target)
        digest = store_bundle(context, replace_fields(bundle, **harness))
        consumed = [rid for e in fresh for rid in e.sources]
        context.metrics.record("skills.entries", float(len(entries)))
        return LearnerOutput(
            harness=digest,
            consumed=list(dict.fromkeys(consumed)),
            metrics={
                "new": len(fresh),
                "kept": len(entries),
                "clusters": len(clusters),
                "dropped": dropped,
                "scrubbed": dict(sorted(scrubbed.items())),
            },
        )


def signal_text(example: TrainingExample) -> str:
    """The example's feedback and correction as text ('' when it has neither)."""
    texts = [
        f if isinstance(f, str) else json.dumps(f, ensure_ascii=False) for f in example.feedback
    ]
    if example.correction is not None:
        texts.append(example.target_text() or "")
    return "\n".join(t for t in texts if t)


def cluster(examples: list[TrainingExample], threshold: float) -> list[list[TrainingExample]]:
    """Greedy single-link clusters by token Jaccard of ``signal_text``, largest first."""
    groups: list[list[tuple[frozenset[str], TrainingExample]]] = []
    for example in sorted(examples, key=lambda e: e.record_id):
        words = tokens(signal_text(example)) - _STOPWORDS
        home = next(
            (g for g in groups if any(jaccard(words, other) >= threshold for other, _ in g)),
            None,
        )
        if home is None:
            groups.append([(words, example)])
        else:
            home.append((words, example))
    groups.sort(key=lambda g: (-len(g), g[0][1].record_id))
    return [[example for _, example in g] for g in groups]


def _sources(members: list[TrainingExample]) -> list[str]:
    return sorted({rid for e in members for rid in (e.source_ids or (e.record_id,))})


def _keywords(texts: list[str], count: int) -> list[str]:
    counter: Counter[str] = Counter()
    for text in texts:
        counter.update(w for w in tokens(text) if len(w) > 2 and w not in _STOPWORDS)
    return [word for word, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


def template(members: list[TrainingExample]) -> Entry:
    """The deterministic entry for a cluster: its feedback and preferred answers."""
    feedback = list(
        dict.fromkeys(_clip(signal_text(e).split("\n")[0]) for e in members if e.feedback)
    )
    answers = list(
        dict.fromkeys(_clip(e.target_text() or "") for e in members if e.correction is not None)
    )
    asks = [
        str(m.get("content", "")) for e in members for m in e.messages if m.get("role") == "user"
    ]
    topic = _keywords(asks, 4)
    lines = ["Recurring feedback on similar requests:"]
    lines += [f"- {text}" for text in feedback[:5]]
    if answers:
        lines.append("Answers that were preferred:")
        lines += [f"- {text}" for text in answers[:5]]
    name = "learned " + " ".join(_keywords([signal_text(e) for e in members], 3) or ["feedback"])
    return Entry(
        name=_safe_name(name),
        when_to_use=f"Requests about: {', '.join(topic)}" if topic else "",
        content="\n".join(lines),
        sources=_sources(members),
    )


def distil(
    members: list[TrainingExample],
    config: SkillsConfig,
    context: LearnerContext | None,
    scrubbed: Counter[str] | None = None,
) -> Entry | None:
    """One entry for a cluster: the reflector's when valid and clean, else the template;
    None when even the template trips the injection scan. With ``scrub_personal_data``
    the reflector's entry is scrubbed too (``scrubbed`` counts what was taken out)."""
    fallback = template(members)
    if context is not None:
        entry = _reflected(members, fallback, config, context)
        if entry is not None and config.scrub_personal_data:
            entry = _scrubbed_entry(entry, Counter() if scrubbed is None else scrubbed)
        if entry is not None and _clean(entry):
            return entry
    return fallback if _clean(fallback) else None


def _scrubbed_entry(entry: Entry, counts: Counter[str]) -> Entry:
    return dataclasses.replace(
        entry,
        name=_safe_name(scrub_personal_text(entry.name, counts)),
        when_to_use=scrub_personal_text(entry.when_to_use, counts),
        content=scrub_personal_text(entry.content, counts),
    )


def _reflected(
    members: list[TrainingExample], fallback: Entry, config: SkillsConfig, context: LearnerContext
) -> Entry | None:
    body = "\n\n".join(
        f"user: {e.messages[-1].get('content', '') if e.messages else ''}\n"
        f"feedback: {signal_text(e)}"
        for e in members[:10]
    )
    try:
        text = context.reflector.reflect(reflection_messages(PROMPT, body, ANSWER_FORMAT))
        document = json.loads(text.strip())
    except Exception:  # the reflector is a model call; anything wrong means the template
        return None
    if not isinstance(document, dict) or set(document) != {"name", "when_to_use", "content"}:
        return None
    if not all(isinstance(v, str) and v.strip() for v in document.values()):
        return None
    if len(document["content"]) > config.max_content_chars:
        return None
    return Entry(
        name=_safe_name("learned " + document["name"]),
        when_to_use=document["when_to_use"].strip()[:300],
        content=document["content"].strip(),
        sources=fallback.sources,
    )


def _clean(entry: Entry) -> bool:
    harness = Harness(
        schema_version=1,
        skills=[Skill(name=entry.name, when_to_use=entry.when_to_use, content=entry.content)],
    )
    return not scan_for_injection(harness)


def previous_entries(harness: Harness, target: str) -> list[Entry]:
    """Entries an earlier run of this learner added (those listed in ``learned_sources``)."""
    sources = harness.orchestration.extra.get(SOURCES_KEY)
    if not isinstance(sources, dict):
        return []
    if target == "skills":
        return [
            Entry(s.name, s.when_to_use, s.content, list(sources[s.name]))
            for s in harness.skills
            if s.name in sources
        ]
    return [
        Entry(key, "", _strip_citation(text), list(sources[key]))
        for text in harness.memory
        if (key := _memory_key(text)) in sources
    ]


def merge(previous: list[Entry], fresh: list[Entry], config: SkillsConfig) -> list[Entry]:
    """New entries first; an earlier entry similar to a new one is folded into it."""
    kept: list[Entry] = []
    for entry in [*fresh, *previous]:
        words = tokens(entry.content)
        twin = next(
            (
                k
                for k in kept
                if k.name == entry.name
                or jaccard(words, tokens(k.content)) >= config.dedup_threshold
            ),
            None,
        )
        if twin is None:
            kept.append(entry)
        else:
            twin.sources = sorted(set(twin.sources) | set(entry.sources))
    return kept[: config.max_skills]


def apply(harness: Harness, entries: list[Entry], target: str) -> dict[str, Any]:
    """The harness fields to replace: learned entries swapped in, hand-written kept."""
    old = harness.orchestration.extra.get(SOURCES_KEY)
    old_names = set(old) if isinstance(old, dict) else set()
    extra = {**harness.orchestration.extra, SOURCES_KEY: {e.name: e.sources for e in entries}}
    orchestration = {**harness.orchestration.model_dump(mode="json"), "extra": extra}
    if target == "skills":
        kept = [s.model_dump(mode="json") for s in harness.skills if s.name not in old_names]
        taken = {s["name"] for s in kept}
        learned = [
            {
                "name": e.name,
                "description": _citation(e.sources),
                "when_to_use": e.when_to_use,
                "content": e.content,
            }
            for e in entries
            if e.name not in taken
        ]
        return {"skills": kept + learned, "orchestration": orchestration}
    memory = [m for m in harness.memory if _memory_key(m) not in old_names]
    memory += [f"{e.content}\n({_citation(e.sources)}) [{e.name}]" for e in entries]
    return {"memory": memory, "orchestration": orchestration}


def _citation(sources: list[str]) -> str:
    shown = ", ".join(sources[:_MAX_CITED])
    more = f" and {len(sources) - _MAX_CITED} more" if len(sources) > _MAX_CITED else ""
    return f"Learned from records {shown}{more}"


def _memory_key(text: str) -> str:
    match = re.search(r"\[([^\[\]]+)\]$", text)
    return match.group(1) if match else ""


def _strip_citation(text: str) -> str:
    return re.sub(r"\n\(Learned from records [^)]*\) \[[^\[\]]+\]$", "", text)


def _safe_name(name: str) -> str:
    cleaned = _NAME_CHARS.sub(" ", name).strip()
    cleaned = re.sub(r"\s+", " ", cleaned)[:64].strip()
    return cleaned if cleaned and cleaned[0].isalnum() else "learned skill"


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
