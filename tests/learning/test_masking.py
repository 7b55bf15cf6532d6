"""What trains (``reef.learning.trainers.masking``): per chat template in use and per
dialect a conversation came in, token by token.

One tool-using, multi-turn trajectory is written as an OpenAI chat, an Anthropic
Messages and an OpenAI Responses exchange, converted by Reef's own functions
(``chat_messages``, ``canonical_exchange``, ``openai_chat_messages``, then the learners'
``tool_messages``) and masked under each template: Reef's tiny ChatML, SmolLM2's,
Llama 3's, Llama 3.1's (with tools) and Qwen2.5's (with tools), the last four with
tokenizers trained here on the templates' own vocabulary (nothing downloaded). The
trained tokens, decoded run by run, must be exactly the assistant turns as the
template renders them, each with its end-of-turn token: no header, no tool result, no
user or system text, no newline after the end token.
"""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from reef.engine.tiny import build_tiny_tokenizer
from reef.experience import RecordView, canonical_exchange, chat_messages
from reef.learning.learners._examples import tool_messages
from reef.learning.trainers.lora_sft import build_features
from reef.learning.trainers.masking import (
    IGNORE_INDEX,
    MaskedTokens,
    TemplateMaskError,
    mask_conversation,
    sampled_turn,
    template_chat,
)
from reef.learning.trainers.preference import prompt_features
from reef.learning.trainers.spec import SFTExample
from reef.upstream.canonical import openai_chat_messages

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
SYSTEM = "You are the order desk. Be brief."
ORDER = {"type": "object", "properties": {"order_id": {"type": "string"}}}
FIRST_RESULT = '{"status": "shipped"}'
SECOND_RESULT = "cancelled"

# Llama 3's (and Qwen2's) pre-tokenizer split: newlines never join the letters after them.
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def call(call_id: str, name: str, order: str) -> dict[str, Any]:
    arguments = json.dumps({"order_id": order})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def openai_exchange() -> tuple[dict[str, Any], dict[str, Any]]:
    tools = [
        {"type": "function", "function": {"name": n, "description": d, "parameters": ORDER}}
        for n, d in (("get_order", "Look an order up."), ("cancel_order", "Cancel an order."))
    ]
    request = {
        "model": "m",
        "tools": tools,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Where is order A17?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [call("call_1", "get_order", "A17")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": FIRST_RESULT},
            {"role": "assistant", "content": "Order A17 has shipped."},
            {"role": "user", "content": "Cancel order B2 please."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("call_2", "cancel_order", "B2")],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": SECOND_RESULT},
        ],
    }
    reply = {"role": "assistant", "content": "Order B2 is cancelled."}
    return request, {"choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]}


def anthropic_exchange() -> tuple[dict[str, Any], dict[str, Any]]:
    tools = [
        {"name": n, "description": d, "input_schema": ORDER}
        for n, d in (("get_order", "Look an order up."), ("cancel_order", "Cancel an order."))
    ]

    def use(call_id: str, name: str, order: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": {"order_id": order}}

    def result(call_id: str, text: str) -> dict[str, Any]:
        return {"type": "tool_result", "tool_use_id": call_id, "content": text}

    request = {
        "model": "m",
        "max_tokens": 100,
        "system": SYSTEM,
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Where is order A17?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    use("call_1", "get_order", "A17"),
                ],
            },
            {"role": "user", "content": [result("call_1", FIRST_RESULT)]},
            {"role": "assistant", "content": [{"type": "text", "text": "Order A17 has shipped."}]},
            {"role": "user", "content": "Cancel order B2 please."},
            {"role": "assistant", "content": [use("call_2", "cancel_order", "B2")]},
            {"role": "user", "content": [result("call_2", SECOND_RESULT)]},
        ],
    }
    response = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "Order B2 is cancelled."}],
        "stop_reason": "end_turn",
    }
    return request, response


def responses_exchange() -> tuple[dict[str, Any], dict[str, Any]]:
    tools = [
        {"type": "function", "name": n, "description": d, "parameters": ORDER}
        for n, d in (("get_order", "Look an order up."), ("cancel_order", "Cancel an order."))
    ]

    def said(text: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text}]
        return {"type": "message", "role": "assistant", "content": content}

    def called(call_id: str, name: str, order: str) -> dict[str, Any]:
        arguments = json.dumps({"order_id": order})
        return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}

    def output(call_id: str, text: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    request = {
        "model": "m",
        "instructions": SYSTEM,
        "tools": tools,
        "input": [
            {"role": "user", "content": "Where is order A17?"},
            said("Let me check."),
            called("call_1", "get_order", "A17"),
            output("call_1", FIRST_RESULT),
            said("Order A17 has shipped."),
            {"role": "user", "content": "Cancel order B2 please."},
            called("call_2", "cancel_order", "B2"),
            output("call_2", SECOND_RESULT),
        ],
    }
    return request, {"id": "resp_1", "output": [said("Order B2 is cancelled.")]}


EXCHANGES = {
    "openai.chat": openai_exchange,
    "anthropic.messages": anthropic_exchange,
    "openai.responses": responses_exchange,
}


def record(api: str) -> RecordView:
    request, response = EXCHANGES[api]()
    return RecordView(
        id="r1",
        scenario="orders",
        session_id="s1",
        turn=0,
        release_id=None,
        api=api,
        request=request,
        response=response,
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        prompt_hash="h",
        content_hash="c",
        tags={},
        principal=None,
        purpose="serve",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def trajectory(api: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The whole trajectory (the request's conversation and the reply) as the trainers
    take it, and the tools offered."""
    view = record(api)
    exchange = canonical_exchange(view)
    assert exchange.reply is not None
    messages = [*chat_messages(view), *openai_chat_messages([exchange.reply])]
    return tool_messages(messages), exchange.tools


CHATML_TURNS = [
    'Let me check.\n<tool_call>\n{"name": "get_order", "arguments": {"order_id": "A17"}}\n'
    "</tool_call><|im_end|>",
    "Order A17 has shipped.<|im_end|>",
    '<tool_call>\n{"name": "cancel_order", "arguments": {"order_id": "B2"}}\n</tool_call>'
    "<|im_end|>",
    "Order B2 is cancelled.<|im_end|>",
]
LLAMA_TURNS = [turn.replace("<|im_end|>", "<|eot_id|>") for turn in CHATML_TURNS]
# Llama 3.1 renders a call as its own JSON and drops the text beside it.
LLAMA31_TURNS = [
    '{"name": "get_order", "parameters": {"order_id": "A17"}}<|eot_id|>',
    "Order A17 has shipped.<|eot_id|>",
    '{"name": "cancel_order", "parameters": {"order_id": "B2"}}<|eot_id|>',
    "Order B2 is cancelled.<|eot_id|>",
]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
TEMPLATE_CASES = {
    # name: (template file, special tokens, bos, eos)
    "smollm2": ("smollm2-instruct.jinja", CHATML_SPECIALS, "<|im_start|>", "<|im_end|>"),
    "llama-3": ("llama-3-instruct.jinja", LLAMA_SPECIALS, "<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.1": ("llama-3.1-instruct.jinja", LLAMA_SPECIALS, "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": ("qwen2.5-instruct.jinja", CHATML_SPECIALS, None, "<|im_end|>"),
}
EXPECTED = {
    "tiny": CHATML_TURNS,
    "smollm2": CHATML_TURNS,
    "llama-3": LLAMA_TURNS,
    "llama-3.1": LLAMA31_TURNS,
    "qwen2.5": CHATML_TURNS,
}


@cache
def tokenizer_for(name: str) -> PreTrainedTokenizerFast:
    """Reef's tiny tokenizer, or a byte-level BPE trained (deterministically) on the
    template's text and the trajectory's, with the template's special tokens."""
    if name == "tiny":
        return build_tiny_tokenizer()
    filename, specials, bos, eos = TEMPLATE_CASES[name]
    template = (TEMPLATES / filename).read_text().strip()
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [template, *(json.dumps(EXCHANGES[api]()) for api in EXCHANGES)]
    backend.train_from_iterator(corpus, trainer)
    # Qwen2.5 has its call and response tags as tokens of their own, not special ones.
    backend.add_tokens([AddedToken(t, special=False) for t in ("<tool_call>", "</tool_call>")])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=specials[0],
        chat_template=template,
    )


def trained_runs(tokenizer: PreTrainedTokenizerFast, masked: MaskedTokens) -> list[str]:
    """The trained tokens, decoded run by run."""
    runs: list[list[int]] = []
    previous = False
    for token, keep in zip(masked.input_ids, masked.train, strict=True):
        if keep and not previous:
            runs.append([])
        if keep:
            runs[-1].append(token)
        previous = keep
    return [str(tokenizer.decode(run)) for run in runs]


@pytest.mark.parametrize("api", sorted(EXCHANGES))
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_only_what_the_model_produced_trains(name: str, api: str) -> None:
    tokenizer = tokenizer_for(name)
    messages, tools = trajectory(api)
    masked = mask_conversation(tokenizer, messages, tools, turns="all")
    assert trained_runs(tokenizer, masked) == EXPECTED[name]
    # the ids are the template's own, as the engine tokenizes a conversation
    chat = template_chat(tokenizer, messages, tools)
    served = tokenizer.apply_chat_template(
        chat.messages, tokenize=True, return_dict=False, **chat.extra
    )
    assert masked.input_ids == list(served)[: len(masked.input_ids)]
    text = str(tokenizer.decode(masked.input_ids))
    assert SECOND_RESULT in text and "Cancel order B2 please." in text  # present, untrained
    assert masked.train[-1]  # the sequence ends at the last end-of-turn token


def test_the_dialects_give_one_conversation() -> None:
    # Arguments are JSON text in the dialect's own spacing; templates get the object.
    conversations = [
        json.loads(json.dumps(trajectory(api)[0]), object_hook=parsed_arguments)
        for api in EXCHANGES
    ]
    assert conversations[0] == conversations[1] == conversations[2]


def parsed_arguments(value: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value.get("arguments"), str):
        return {**value, "arguments": json.loads(value["arguments"])}
    return value


@pytest.mark.parametrize("name", ["tiny", "smollm2", "llama-3"])
def test_where_reef_renders_the_tools_the_dialects_give_the_same_tokens(name: str) -> None:
    # A template that takes ``tools`` renders each schema with its keys in the order the
    # client sent them (Anthropic's ``input_schema`` comes before its description), so
    # there only the conversation and the trained turns agree (the tests above).
    tokenizer = tokenizer_for(name)
    found = [mask_conversation(tokenizer, *trajectory(api)) for api in EXCHANGES]
    assert len({(tuple(m.input_ids), tuple(m.train)) for m in found}) == 1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_last_trains_only_the_final_turn(name: str) -> None:
    tokenizer = tokenizer_for(name)
    messages, tools = trajectory("anthropic.messages")
    masked = mask_conversation(tokenizer, messages, tools, turns="last")
    assert trained_runs(tokenizer, masked) == EXPECTED[name][-1:]
    assert masked.labels[: masked.prompt_length] == [IGNORE_INDEX] * masked.prompt_length


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sft_and_preference_train_the_reply_by_the_rule(name: str) -> None:
    tokenizer = tokenizer_for(name)
    messages, tools = trajectory("openai.responses")
    context, reply = messages[:-1], str(messages[-1]["content"])
    example = SFTExample(messages=context, target=reply, tools=tools)
    features = build_features(tokenizer, example, max_seq_len=4096)
    wanted = mask_conversation(tokenizer, messages, tools, turns="last")
    assert (features.input_ids, features.labels) == (wanted.input_ids, wanted.labels)
    pair = prompt_features(tokenizer, context, tools, [reply, "No."], 4096)
    assert not isinstance(pair, str)
    assert (pair[0].input_ids, pair[0].labels) == (wanted.input_ids, wanted.labels)
    rejected = [t for t in pair[1].labels if t != IGNORE_INDEX]
    end = EXPECTED[name][-1].removeprefix("Order B2 is cancelled.")
    assert tokenizer.decode(rejected) == "No." + end


def test_sampled_tokens_train_after_the_prompt() -> None:
    masked = sampled_turn([5, 6, 7], [8, 9])
    assert masked.input_ids == [5, 6, 7, 8, 9]
    assert masked.labels == [IGNORE_INDEX] * 3 + [8, 9]
    assert masked.prompt_length == 3


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    tokenizer = build_tiny_tokenizer()
    # Marks the last message: the rendering of a turn changes once another follows it.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if loop.last %}>{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}<|im_end|>{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye"},
    ]
    with pytest.raises(TemplateMaskError, match="message 1"):
        mask_conversation(tokenizer, messages)


def test_no_trainer_builds_a_mask_of_its_own() -> None:
    # No -100 of its own, no labels built as "ignore the prompt's length, then ids".
    trainers_dir = Path(__file__).parents[2] / "src" / "reef" / "learning" / "trainers"
    for module in sorted(trainers_dir.glob("*.py")):
        if module.name == "masking.py":
            continue
        source = module.read_text()
        literals = [
            node
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and node.operand.value == 100
        ]
        assert not literals and "IGNORE_INDEX] * len(" not in source, module.name
