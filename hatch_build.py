"""Puts ``stepwatch-auto.pth`` in site-packages, for regular and editable installs alike, so that
``STEPWATCH=auto python train.py`` instruments a program that never imports stepwatch. The file's one line
imports stepwatch only when ``STEPWATCH=auto``; otherwise it costs a dictionary lookup at startup."""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class AutoStartHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {})["src/stepwatch-auto.pth"] = "stepwatch-auto.pth"
