"""A problem with many right answers and its checker, for the code reward's tests
(``tests/rl/test_code_reward.py``, ``tests/rl/test_sandbox_server.py``): tests/ is on
``sys.path``, so ``from code_checks import SPLIT, split_checker``."""

from __future__ import annotations

# two numbers that sum to the input: one right answer recorded of many
SPLIT = {"inputs": ["5\n", "9\n"], "outputs": ["2 3\n", "4 5\n"]}


def split_checker(given: str, output: str, expected: str) -> bool:
    """Any two whole numbers that sum to the input (the recorded answer is one of many)."""
    numbers = output.split()
    return len(numbers) == 2 and all(n.lstrip("-").isdigit() for n in numbers) and \
        sum(map(int, numbers)) == int(given)
