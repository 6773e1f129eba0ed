"""Prompts as chat messages: checking their shape, and turning a prompt into a model's tokens.

A prompt is a string or a list of chat messages, ``[{"role": "user", "content": "2+2="}]``, as
verl's and TRL's conversational datasets hold them. Messages are rendered with the model's own
chat template (``add_generation_prompt=True``: the text ends where the assistant's answer
starts), then encoded without special tokens (the template writes them, Llama 3's BOS
included). A string is encoded as is, with what the tokenizer's post-processor adds to a raw
prompt (Llama 3's BOS; nothing for Qwen), unless ``chat_template`` asks to render it as one
user message. No torch here: the controller imports this.
"""

from __future__ import annotations

from typing import Any

from pivotflow.tokenizer.base import Message, Tokenizer

Prompt = str | list[Message]


def message_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a list of chat messages (one short phrase, never the
    value itself), or None when it is one: a non-empty list of objects, each with a non-empty
    string ``role`` and a string ``content`` (other keys, e.g. ``name``, are kept)."""
    if not isinstance(value, list):
        return f"expected a list of messages, got {type(value).__name__}"
    if not value:
        return "the message list is empty"
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            return f"message {i} is a {type(msg).__name__}, not an object with role and content"
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not role:
            got = "missing" if "role" not in msg else type(role).__name__
            return f"message {i} needs a non-empty string 'role' ({got})"
        if not isinstance(content, str):
            got = "missing" if "content" not in msg else type(content).__name__
            return f"message {i} needs a string 'content' ({got})"
    return None


def is_messages(prompt: Any) -> bool:
    """True for a list (a prompt of messages; its shape is checked where it was read)."""
    return isinstance(prompt, list)


def render(tok: Tokenizer, prompt: Prompt, *, chat_template: bool = False,
           tools: list[dict[str, Any]] | None = None) -> tuple[str, bool]:
    """(text, templated): the prompt's text, and whether the chat template rendered it (with
    ``tools``' schemas, where the template takes them: Qwen2.5's lists them in its system
    message)."""
    if isinstance(prompt, str) and not chat_template:
        return prompt, False
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return tok.apply_chat_template(messages, add_generation_prompt=True, tools=tools), True


def encode_prompt(tok: Tokenizer, prompt: Prompt, *, chat_template: bool = False,
                  tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The ids a model is prompted with (see the module's docstring)."""
    text, templated = render(tok, prompt, chat_template=chat_template, tools=tools)
    return tok.encode(text, add_special_tokens=not templated)


def encode_conversation(tok: Tokenizer, conversation: Prompt) -> list[int]:
    """The ids a reward model reads: a whole conversation, the answer included, rendered with
    its chat template without a generation prompt (the text ends with the answer) and encoded
    without special tokens; a string is encoded as it is."""
    if isinstance(conversation, str):
        return tok.encode(conversation, add_special_tokens=True)
    return tok.encode(tok.apply_chat_template(conversation, add_generation_prompt=False))


def with_answer(prompt: Prompt, response: str) -> list[Message]:
    """``prompt`` (a string: one user message) followed by ``response`` as the assistant's."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return [*messages, {"role": "assistant", "content": response}]
