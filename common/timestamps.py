"""Kubernetes timestamps (RFC 3339 Time and MicroTime) as unix seconds."""

from __future__ import annotations

import datetime


def epoch(text: str | None) -> float | None:
    """Unix seconds of an RFC 3339 timestamp; None if absent or malformed."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
