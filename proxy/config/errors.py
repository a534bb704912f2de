"""The error every configuration check raises: which key, and what is wrong with it."""

from __future__ import annotations


class ConfigError(Exception):
    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"{key}: {detail}" if key else detail)
        self.key = key
        self.detail = detail
