"""Task families with exact verifiers and deterministic tools (docs/architecture.md §3).

The contract lives in :mod:`envs.tasks.base`; the registry of family names in
:mod:`envs.tasks.registry` (re-exported here lazily, so importing ``envs.tasks.base`` stays cheap).
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAMILIES", "generate_tasks", "get_family", "verify_task"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from envs.tasks import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'envs.tasks' has no attribute {name!r}")
