"""The built-in models' tokenizer: a small byte-level BPE trained on the task kit's own text.

It is laid out as Qwen2.5's is, so the built-in models take the path a user's Qwen checkpoint
takes (an ordinary Hugging Face tokenizer folder, loaded by ``pivotflow.tokenizer``):

* pre-tokenizer: every digit on its own (Qwen's and Llama 3's rule: a number is its digits, so
  arithmetic never depends on how a merge happened to cut a number), then GPT-2's byte-level
  split; decoder: byte-level. All 256 bytes are in the vocabulary, so any text encodes;
* added tokens: ``<|endoftext|>`` (ids 0: eos and pad; there is no BOS, as in Qwen),
  ``<|im_start|>`` and ``<|im_end|>`` (1, 2: special, dropped by ``decode(skip_special=True)``),
  then ``<tool_call>`` and ``</tool_call>`` (3, 4) as Qwen2.5 has them: one token each but *not*
  special, so decoded text keeps the tags the Hermes parser reads. The trainer never sees their
  text (it is cut out of the corpus), so no merge is spent on them;
* merges learned on the kit's own text up to ``VOCAB_SIZE`` tokens: arithmetic problems and
  answers, the judge's ``"47+38=84?85:No"`` lines, tool-call trajectories in the Hermes format,
  and the same examples rendered as ChatML with the tools system prompt, so the JSON keys, the
  verdict words and the template's words are one token or a few;
* a ChatML chat template with tools, Qwen2.5's (only the default system message differs).

Training is deterministic: the same seed gives the same files byte for byte.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

EOS = "<|endoftext|>"
SPECIAL = (EOS, "<|im_start|>", "<|im_end|>")
TOOL_TAGS = ("<tool_call>", "</tool_call>")
VOCAB_SIZE = 512  # 256 bytes + 5 added tokens + up to 251 merges
MIN_FREQUENCY = 8  # a merge must be worth it on the kit's text, not on one garbage candidate
DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2.5-Instruct's template, with tools (Hermes-style <tool_call> JSON in the assistant turn,
# tool results as <tool_response> blocks in a user turn); its default system message names Qwen.
CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- '" + DEFAULT_SYSTEM + "' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

_ADDED = re.compile("|".join(re.escape(t) for t in (*SPECIAL, *TOOL_TAGS)))


def _untrained() -> Any:
    """The BPE pipeline with no merges yet: the pre-tokenizer, decoder and added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return tok


def _wrap(raw: Any) -> Any:
    """``raw`` (a ``tokenizers.Tokenizer``) as the project's HF tokenizer, with the template."""
    from pivotflow.tokenizer.hf import HFTokenizer

    return HFTokenizer.from_parts(raw, eos_token=EOS, pad_token=EOS, chat_template=CHAT_TEMPLATE)


def corpus(seed: int, n: int = 2000) -> list[str]:
    """The training text, deterministic in ``seed``: about ``n`` lines of each kind."""
    from pivotflow.tasks.arithmetic import ArithmeticTask
    from pivotflow.tasks.judge_format import judge_examples
    from pivotflow.tasks.registry import make_dataset
    from pivotflow.tasks.tool_rollout import tool_segments
    from pivotflow.tools.builtin import calculator

    rng = random.Random(seed)
    two_digit = make_dataset(ArithmeticTask(2, "+"), n, seed)
    mixed = [ArithmeticTask(rng.randint(1, 4), "+-*").sample(rng) for _ in range(n)]
    lines = [p.prompt + p.answer for p in two_digit + mixed]
    lines += [e.prompt + e.target for e in judge_examples(two_digit, seed, per_problem=1)]
    trajectories = [(p, tool_segments(p)) for p in two_digit + mixed]
    # the ideal trajectories are text only (observation ids appear only once a tokenizer exists)
    lines += [p.prompt + "".join(t for t, _ in segs if isinstance(t, str))
              for p, segs in trajectories]
    chat = _wrap(_untrained())
    tools = [calculator.schema()]
    for p, segs in trajectories[:: max(1, len(trajectories) // (n // 4))]:
        call = {"name": calculator.name, "arguments": {"expression": p.prompt.removesuffix("=")}}
        lines.append(chat.apply_chat_template([
            {"role": "user", "content": p.prompt},
            {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
            {"role": "tool", "content": segs[2][0]},
            {"role": "assistant", "content": p.answer},
        ], add_generation_prompt=False, tools=tools))
        lines.append(chat.apply_chat_template(
            [{"role": "user", "content": p.prompt}, {"role": "assistant", "content": p.answer}],
            add_generation_prompt=False))
    return lines


def _pieces(lines: list[str]) -> Iterator[str]:
    """The text between added tokens: the trainer would otherwise learn merges of their text."""
    for line in lines:
        yield from (piece for piece in _ADDED.split(line) if piece)


def train_bpe(seed: int = 0) -> Any:
    """The trained ``tokenizers.Tokenizer`` (same seed, same merges, same file)."""
    import json

    from tokenizers import Tokenizer, pre_tokenizers, trainers

    tok = _untrained()
    # The trainer numbers its special tokens first (ids 0-4) and the bytes after them; the tool
    # tags go in as special so they get ids before the bytes, then lose the flag below.
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=MIN_FREQUENCY, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[*SPECIAL, *TOOL_TAGS])
    tok.train_from_iterator(_pieces(corpus(seed)), trainer)
    data = json.loads(tok.to_str())
    for added in data["added_tokens"]:
        added["special"] = added["content"] in SPECIAL
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def build_tokenizer(seed: int = 0) -> Any:
    """The built-in models' tokenizer (a ``pivotflow.tokenizer`` Tokenizer) for ``seed``."""
    return _wrap(train_bpe(seed))
