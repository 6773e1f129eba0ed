"""The live view's table (rich), rendered to a recording console as a terminal would show it."""

from __future__ import annotations

import io

from rich.console import Console

from pivotflow.live import LiveView


def rendered(record: dict[str, object]) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    view = LiveView("grpo", 10, console=console)
    view.last = record
    console.print(view._render())
    return console.export_text()


def test_the_table_shows_response_lengths_and_the_share_cut_at_the_limit() -> None:
    text = rendered({"step": 3, "reward_mean": 0.5, "task_accuracy": 0.25, "samples": 64,
                     "time_s": 4.0, "tokens_generated": 900, "response_len_mean": 41.7,
                     "response_len_max": 128, "response_clip_ratio": 0.0625})
    assert "mean 42  max 128" in text
    assert "cut at limit" in text and "0.062" in text
    assert "reward" in text and "0.500" in text


def test_a_record_without_length_figures_shows_no_response_row() -> None:
    text = rendered({"step": 1, "reward_mean": None, "task_accuracy": None, "samples": 8,
                     "time_s": 1.0, "tokens_generated": 10})
    assert "cut at limit" not in text and "reward" in text
    assert "entropy" not in text  # (no step trained yet)


def test_the_table_shows_the_policys_entropy_and_the_clipped_share() -> None:
    text = rendered({"step": 5, "reward_mean": 0.5, "task_accuracy": 0.5, "samples": 64,
                     "time_s": 9.0, "tokens_generated": 2000, "train_entropy": 1.234,
                     "train_clip_frac": 0.0421})
    assert "entropy" in text and "1.234" in text
    assert "clipped" in text and "0.042" in text


def test_the_table_shows_the_means_of_the_graphs_own_fields() -> None:
    text = rendered({"step": 5, "reward_mean": 0.5, "task_accuracy": 0.5, "samples": 64,
                     "time_s": 9.0, "tokens_generated": 2000,
                     "field_means": {"reward_accuracy_reward": 0.375, "carry": 0.5},
                     "logged_metrics": {"group_size": 4.0}})
    assert "fields" in text and "reward_accuracy_reward 0.375  carry 0.500" in text
    assert "logged" in text and "group_size 4.000" in text
    assert "fields" not in rendered({"step": 1, "reward_mean": None, "task_accuracy": None,
                                     "samples": 8, "time_s": 1.0, "tokens_generated": 10})


def test_the_table_shows_the_calls_of_async_stages() -> None:
    text = rendered({"step": 5, "reward_mean": 0.5, "task_accuracy": 0.5, "samples": 64,
                     "time_s": 9.0, "tokens_generated": 2000,
                     "stage_calls_waiting": {"reward": 12, "keep": 0},
                     "stage_call_ms_p50": {"reward": 20.512, "keep": None}})
    assert "calls" in text and "reward=12 (20.512 ms)  keep=0 (- ms)" in text


def test_the_table_shows_the_last_evaluation_round() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    view = LiveView("grpo", 10, console=console)
    view.last = {"step": 6, "reward_mean": 0.5, "task_accuracy": 0.5, "samples": 64,
                 "time_s": 9.0, "tokens_generated": 2000}
    view.eval = {"step": 5, "task_accuracy": 0.8125, "prompts": 16}
    console.print(view._render())
    text = console.export_text()
    assert "eval" in text and "step 5" in text and "0.812" in text
