"""Lightning's profiler actions as stepwatch's stages: which action is which stage, how the others are grouped,
stage names made safe, and a measurement recorded as a block would. Imports nothing of Lightning."""

from __future__ import annotations

import re
from typing import Any

from .._constants import FOLD, ONE_OFF, OTHER, OVERFLOW
from .._tree import DROPPED

TRANSPARENT = frozenset({"run_training_epoch", "run_training_batch"})
TEST, PREDICT = "test", "predict"
"""The phases of ``trainer.test`` and ``trainer.predict``."""
STAGES = {
    "[Strategy].batch_to_device": "h2d",
    "[Strategy].training_step": "forward",
    "[Strategy].validation_step": "forward",
    "[Strategy].test_step": "forward",
    "[Strategy].predict_step": "forward",
    "[Strategy].backward": "backward",
    "[LightningModule].optimizer_zero_grad": "zero_grad",
}
GROUPS = {"Callback": "callbacks", "LightningModule": "hooks", "LightningDataModule": "hooks", "Strategy": "strategy"}
ACTION = re.compile(r"^\[(\w+)\]([^.]*)\.(\w+)$")


def parse(action_name: str) -> tuple[str, str, str]:
    """``[Callback]ModelCheckpoint{...}.on_validation_end`` -> ("Callback", "ModelCheckpoint", "on_...")."""
    match = ACTION.match(re.sub(r"\{.*\}", "", action_name))
    if match is None or match.group(1) not in GROUPS:
        return "", "", action_name
    return match.group(1), match.group(2), match.group(3)


def safe(name: str) -> str:
    cleaned = "".join(c if c.isprintable() and c != "/" else "_" for c in name.strip()) or "action"
    return cleaned if cleaned not in (OTHER, *ONE_OFF, OVERFLOW) else f"{cleaned}_"  # the reserved names


def record(stopwatch: Any, name: str, elapsed_ns: int) -> None:
    """One measurement under the block open now on this thread, as a block of its own would record it."""
    if stopwatch.stacks.measuring is not True:
        return
    parent = stopwatch.stacks.thread_stack()[-1][1]
    if parent is DROPPED:
        return
    node = parent.children.get(name) or stopwatch.tree.add_child(parent, name)
    node.buf.append(elapsed_ns)
    if len(node.buf) >= FOLD:
        stopwatch.stacks.fold(node)
