"""The arithmetic task, the judge's format, SFT helpers: exact rules, errors that name places."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.errors import TaskError
from pivotflow.tasks.arithmetic import check_answer
from pivotflow.tasks.judge_format import judge_examples, judge_prompt, judge_target, parse_verdict
from pivotflow.tasks.registry import (
    Problem,
    get_task,
    load_jsonl,
    make_dataset,
    save_jsonl,
    split_dataset,
)
from pivotflow.tasks.sft import SFTConfig, greedy_complete, teacher_forced_accuracy, train_sft
from pivotflow.tokenizer.base import Tokenizer


@pytest.mark.parametrize(("completion", "ok"), [
    ("85", True), (" 85\n", True), ("085", False), ("+85", False), ("8 5", False),
    ("85.0", False), ("", False), ("84", False),
])
def test_checker_is_exact(completion: str, ok: bool) -> None:
    assert check_answer("85", completion) is ok


def test_task_problems_are_right_and_seeded() -> None:
    task = get_task("arithmetic")
    a = [task.sample(random.Random(3)) for _ in range(5)]
    b = [task.sample(random.Random(3)) for _ in range(5)]
    assert a == b
    for p in make_dataset(task, 200, 0):
        x, y = p.prompt.rstrip("=").split("+")
        assert int(p.answer) == int(x) + int(y) and task.check(p, p.answer)


def test_unknown_task_is_an_error() -> None:
    with pytest.raises(TaskError, match="arithmatic"):
        get_task("arithmatic")


def test_split_is_disjoint_and_deterministic() -> None:
    probs = make_dataset(get_task("arithmetic"), 1000, 0)
    train, held = split_dataset(probs, 100, 0)
    assert len(held) == 100 and len(train) == 900
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert split_dataset(probs, 100, 0) == (train, held)


def test_jsonl_round_trip_and_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    probs = [Problem(prompt="1+2=", answer="3"), Problem(prompt="4+5=", answer="9")]
    save_jsonl(probs, path)
    assert load_jsonl(path) == probs
    path.write_text(path.read_text() + '{"prompt": 3}\n')
    with pytest.raises(TaskError, match=rf"{path}:3: not a problem record"):
        load_jsonl(path)


def test_verdicts_parse_or_fail_never_zero() -> None:
    assert parse_verdict("85:Yes") == 1.0
    assert parse_verdict("85:No") == 0.0
    for bad in ("", "85:", "85:Maybe", "Yess", "garbage"):
        assert parse_verdict(bad) is None


def test_judge_targets_for_near_misses() -> None:
    p = Problem(prompt="47+38=", answer="85")
    assert judge_prompt(p.prompt, "84") == "47+38=84?"
    assert judge_target(p, "84") == "85:No"
    assert judge_target(p, " 85") == "85:Yes"
    kinds = {e.kind for e in judge_examples([p] * 200, 0)}
    assert kinds == {"correct", "near_miss", "garbage"}
    assert all(e.correct == (e.kind == "correct") for e in judge_examples([p] * 200, 0)
               if e.kind != "garbage")


def test_byte_level_tokenizer_encodes_any_text(bpe: Tokenizer) -> None:
    text = "12\u00e9 \x00\u2603\n"  # what a tool or a sloppy policy may print
    assert bpe.decode(bpe.encode(text)) == text


def test_sft_learns_and_teacher_forcing_equals_greedy(bpe: Tokenizer) -> None:
    torch.manual_seed(0)
    tok = bpe
    pairs = [(f"{a}+{b}=", str(a + b)) for a in range(3) for b in range(3)]
    model = Decoder(ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1))
    res = train_sft(model, tok, pairs, SFTConfig(steps=150, batch_size=9, lr=1e-2, threads=1),
                    progress=False)
    assert res.losses[-1] < res.losses[0] / 5
    tf = teacher_forced_accuracy(model, tok, pairs)
    greedy = greedy_complete(model, tok, [p for p, _ in pairs], 4)
    assert tf == sum(g == c for g, (_, c) in zip(greedy, pairs, strict=True)) / len(pairs)
    assert tf > 0  # some right, so the equality above compares real decodes
