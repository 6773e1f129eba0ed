"""pivotflow: an asyncio single-controller dataflow engine for RL post-training."""

from __future__ import annotations

__version__ = "0.1.0"
