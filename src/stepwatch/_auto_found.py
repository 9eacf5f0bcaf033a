"""What auto-instrumentation found and timed (the loaders, the model and loss classes, the optimizers...): the
report's first line, kept by the session as its wrappers find each part."""

from __future__ import annotations


class WhatAutoFound:
    """What auto-instrumentation found and timed: the report's first line."""

    def __init__(self) -> None:
        self.loaders: dict[int, int] = {}  # id(loader) -> its workers
        self.forward: dict[str, None] = {}
        self.loss: dict[str, None] = {}
        self.backward = False
        self.optimizers: dict[str, None] = {}
        self.zero_grad = False
        self.h2d = False
        self.driven = False
        self.evaluations = 0  # evaluations inside training steps, reported as the val phase
        self.device: str | None = None
        self.active = True  # instrumenting; once not, a reset() of the stopwatch forgets this description

    def describe(self) -> str:
        parts = []
        if self.loaders:
            workers = "/".join(str(w) for w in sorted(set(self.loaders.values())))
            many = len(self.loaders)
            parts.append(f"DataLoader ({workers} workers)" if many == 1 else f"{many} DataLoaders ({workers} workers)")
        if self.driven:
            parts.append("no DataLoader loop: each step ends at an optimizer step (making batches is in step/other)")
        if self.evaluations:
            parts.append(
                f"{self.evaluations} evaluation{'s' if self.evaluations != 1 else ''} inside training steps"
                " (no_grad or eval mode): the val phase, a step per forward"
            )
        if not parts:
            parts.append("no DataLoader loop and no optimizer step: no steps")
        if self.forward:
            parts.append("forward: " + "+".join(self.forward))
        if self.loss:
            parts.append("loss: " + "+".join(self.loss))
        if self.backward:
            parts.append("backward")
        if self.optimizers:
            parts.append("optimizer: " + "+".join(self.optimizers))
        if self.zero_grad:
            parts.append("zero_grad")
        if self.h2d:
            parts.append("h2d")
        if self.device:
            parts.append(f"device timing on {self.device}")
        return "auto: " + ", ".join(parts)
