"""builtin:tool_policy: the trajectory encoding, the cache, and the shipped model's behaviour."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from pivotflow.engines.torch.weights import build_model, load_checkpoint
from pivotflow.errors import CheckpointError
from pivotflow.tasks import tool_policy_cache
from pivotflow.tasks.cache import _digest
from pivotflow.tasks.registry import Problem, get_task, make_dataset, split_dataset
from pivotflow.tasks.tool_policy import encode_segments, ensure_tool_policy
from pivotflow.tasks.tool_policy_cache import check_tool_policy, shipped_tool_policy
from pivotflow.tasks.tool_rollout import call_tool, rollout_eval, tool_segments
from pivotflow.tokenizer import load_tokenizer
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tools.parsers import HermesParser
from pivotflow.tools.pool import ToolResult
from pivotflow.tools.trajectory import observation_text

PROBLEM = Problem(prompt="47+38=", answer="85")


def test_tool_trajectory_text_is_the_fixed_layout() -> None:
    call, observation, answer = (text for text, _ in tool_segments(PROBLEM))
    assert call == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "47+38"}}\n</tool_call>'
    )
    assert observation == observation_text(HermesParser(), [ToolResult("85", name="calculator")])
    assert observation == "\n<tool_response>\n85\n</tool_response>\n"
    assert answer == "85"
    assert [trained for _, trained in tool_segments(PROBLEM)] == [True, False, True]


def test_segment_mask_covers_turns_and_eos_only(bpe: Tokenizer) -> None:
    tok = bpe
    segments = tool_segments(PROBLEM)
    ids, mask = encode_segments(tok, [(PROBLEM.prompt, segments), ("1+2=", [("3", True)])])
    prompt = len(tok.encode(PROBLEM.prompt))
    call, obs, ans = (len(tok.encode(text)) for text, _ in segments)
    # the tags are one token each, the call's JSON keys a few: 47 tokens for 135 characters in all
    assert tok.encode(segments[0][0])[0] == tok.encode("<tool_call>")[0] and call == 23
    total = prompt + call + obs + ans + 1
    assert ids.shape == (2, total) and mask.shape == (2, total - 1)
    assert tok.decode(ids[0].tolist(), skip_special=False) == (
        PROBLEM.prompt + "".join(t for t, _ in segments) + "<|endoftext|>"
    )
    # mask[t] says whether ids[t + 1] is trained
    expected = torch.zeros(total, dtype=torch.bool)
    expected[prompt : prompt + call] = True  # turn 1: the call
    expected[prompt + call + obs : total] = True  # turn 2: the answer and EOS
    assert torch.equal(mask[0], expected[1:])
    assert ids[0, -1] == tok.eos_id and mask[0, -1]
    # the direct row: "3" and EOS only, nothing on its prompt or its padding
    direct = torch.zeros(total, dtype=torch.bool)
    direct[4:6] = True
    assert torch.equal(mask[1], direct[1:])
    assert tok.decode(ids[1, :6].tolist(), skip_special=False) == "1+2=3<|endoftext|>"
    assert (ids[1, 6:] == tok.pad_id).all()


def test_sampled_ids_are_kept_not_encoded_again(bpe: Tokenizer) -> None:
    # "=?" is one merged token; sampled as "=" then "?" it must stay two (token-in/token-out)
    apart = [bpe.encode("=")[0], bpe.encode("?")[0]]
    assert len(bpe.encode("=?")) == 1
    ids, mask = encode_segments(bpe, [("1+2", [(apart, True)])])
    assert ids[0].tolist() == [*bpe.encode("1+2"), *apart, bpe.eos_id]
    assert mask[0].tolist() == [False, False, True, True, True]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call>',
            "division",
        ),
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": 12}}\n</tool_call>',
            "expression",
        ),
        ('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>', "unknown tool"),
        ('<tool_call>\n{"name": "calculator", "arguments": {"expr\n</tool_call>', "JSON"),
    ],
)
def test_bad_calls_become_error_observations(text: str, needle: str) -> None:
    results, ok = call_tool(text, HermesParser())
    assert not ok and len(results) == 1
    assert results[0].content.startswith("Error: ") and needle in results[0].content


def test_good_call_runs_the_calculator() -> None:
    results, ok = call_tool(tool_segments(PROBLEM)[0][0], HermesParser())
    assert ok and [r.content for r in results] == ["85"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh PIVOTFLOW_CACHE in which building (training) the tool policy fails loudly:
    these tests must be served by the shipped copy."""
    monkeypatch.setenv("PIVOTFLOW_CACHE", str(tmp_path))

    def no_training(*args: object, **kwargs: object) -> dict:
        raise AssertionError("the shipped tool policy was not used; training started")

    monkeypatch.setattr(tool_policy_cache, "_build", no_training)
    return tmp_path


def test_ensure_copies_the_shipped_checkpoint_and_repairs_corruption(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shipped = shipped_tool_policy(0)
    check_tool_policy(shipped)
    root = ensure_tool_policy(0, progress=False)
    assert root == cache / "tool-policy-v3-seed0"
    check_tool_policy(root)
    config, tensors = load_checkpoint(root)
    assert config.max_position_embeddings == 160
    assert _digest(root / "model.safetensors") == _digest(shipped / "model.safetensors")

    (root / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="does not match its recorded hash"):
        check_tool_policy(root)
    with caplog.at_level(logging.WARNING, logger="pivotflow.cache"):
        assert ensure_tool_policy(0, progress=False) == root
    assert "rebuilding the tool policy" in caplog.text
    check_tool_policy(root)
    assert _digest(root / "model.safetensors") == _digest(shipped / "model.safetensors")


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda r: (r / "config.json").write_text("{not json"), "config.json is not JSON"),
        (lambda r: (r / "tokenizer.json").unlink(), "tokenizer.json is missing"),
        (lambda r: (r / "hashes.json").unlink(), "hashes.json: unreadable"),
    ],
)
def test_corruption_is_named(tmp_path: Path, damage, match: str) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "copy"
    shutil.copytree(shipped_tool_policy(0), root)
    check_tool_policy(root)
    damage(root)
    with pytest.raises(CheckpointError, match=match):
        check_tool_policy(root)


def test_shipped_model_sometimes_calls_and_copies_the_answer() -> None:
    config, tensors = load_checkpoint(shipped_tool_policy(0))
    model = build_model(config, tensors, "cpu", torch.float32)
    tok = load_tokenizer(shipped_tool_policy(0))
    _, held = split_dataset(make_dataset(get_task("arithmetic"), 8100, 0), 500, 0)
    problems = held[300:400]  # not the 300 that decided when training stopped
    figs = rollout_eval(model, tok, problems, seed=1)
    assert figs == rollout_eval(model, tok, problems, seed=1)  # seeded: the same samples again
    assert figs["n"] == 100
    assert 0.05 <= figs["tool_rate"] <= 0.45
    # the base policy slips copying too (v2 models): 0.63 here, ~0.3 without the tool
    assert figs["tool_accuracy"] >= max(0.5, figs["direct_accuracy"] + 0.2)
    assert figs["malformed_calls"] <= 5
    called = round(figs["tool_rate"] * 100)
    right = figs["tool_accuracy"] * called + figs["direct_accuracy"] * (100 - called)
    assert figs["accuracy"] == pytest.approx(right / 100)
