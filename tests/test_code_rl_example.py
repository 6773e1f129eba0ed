"""examples/code_rl.py: its tasks' reference solutions pass their own tests in the sandbox (and a
wrong one does not), and a run on a Hugging Face folder judges every program it writes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import sandbox_server

from pivotflow.run import run

EXAMPLE = Path(__file__).parents[1] / "examples" / "code_rl.py"


def test_every_reference_solution_passes_its_tests_and_a_wrong_one_does_not(
        tmp_path: Path, script: Callable[[Path], ModuleType],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIVOTFLOW_CACHE", str(tmp_path / "cache"))  # (the C++ task's header)
    module = script(EXAMPLE)
    tasks = module.write_tasks(tmp_path / "code_tasks.jsonl")
    assert module.check(tasks) == [1.0] * len(module.TASKS)
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    rows[0]["reference"], rows[3]["reference"] = rows[3]["reference"], rows[0]["reference"]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = module.check(tasks)
    assert got[0] == 0.0 and got[3] == 0.0 and got[1:3] == [1.0, 1.0]


@pytest.fixture
def sandbox_url(tmp_path: Path) -> Iterator[str]:
    """A sandbox server on a free loopback port: its URL."""
    with sandbox_server(tmp_path / "cache") as (url, _):
        yield url


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["here", "server"])
def test_a_run_judges_every_program_the_policy_writes(
        tmp_path: Path, script: Callable[[Path], ModuleType], where: str,
        request: pytest.FixtureRequest) -> None:
    """Two steps of the example on the byo example's tiny random Qwen2, the programs run here
    or on a sandbox server: every program is run (the step's outcome shares sum to 1), nothing
    is lost, every step's reward is the sandbox's (a random model's text passes nothing:
    reward 0)."""
    module = script(EXAMPLE)
    byo = script(EXAMPLE.with_name("byo_model.py"))
    model = byo.build_tiny_folder(tmp_path / "model")
    tasks = module.write_tasks(tmp_path / "code_tasks.jsonl")
    server = [f"graph.sandbox_url={request.getfixturevalue('sandbox_url')}"] \
        if where == "server" else []
    result = run(EXAMPLE, steps=2, out=tmp_path / "run", console=False,
                 sets=[f"graph.model={model}", f"graph.prompts={tasks}", "live=false",
                       "planner=static", *server])
    assert result.summary["ledger"]["lost"] == 0 and result.summary["steps"] == 2
    records = [json.loads(line)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        shares = rec["logged_metrics"]
        assert sum(shares[f"code_{k}"] for k in ("ok", "wrong", "error", "timeout",
                                                  "other")) == pytest.approx(1.0)
        assert rec["reward_mean"] == pytest.approx(shares["code_ok"])
