"""run.asyncio_run: an ImportError raised inside the run surfaces as itself (it was once
caught as "no uvloop" and the same coroutine re-run: "cannot reuse already awaited coroutine")."""

import pytest

from pivotflow.run import asyncio_run

pytestmark = pytest.mark.timeout(30)


async def _raises_import_error() -> None:
    raise ImportError("cannot import name 'x' from 'a_graph'")


async def _answer() -> int:
    return 42


def test_an_import_error_inside_the_run_is_raised_as_itself() -> None:
    with pytest.raises(ImportError, match="cannot import name 'x' from 'a_graph'"):
        asyncio_run(_raises_import_error())


def test_a_run_returns_its_coroutines_value() -> None:
    assert asyncio_run(_answer()) == 42
