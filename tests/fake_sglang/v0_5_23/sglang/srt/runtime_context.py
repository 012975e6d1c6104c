"""The published process context: publish() resolves and seals a ServerArgs with this
process's ranks; the runner refuses one that was not published."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import fake_core

_CONTEXT: dict = {}


@dataclass(frozen=True, kw_only=True)
class SpawnRanks:
    world_rank: int
    dp_rank: int | None = None
    gpu_id: int | None = None


def spawn_world_rank(server_args, *, tp_rank, pp_rank):
    return server_args.tp_size * pp_rank + tp_rank


def publish(server_args, *, role, hf_config=None, ranks=None):
    server_args.resolve_once()
    _CONTEXT.update(server_args=server_args, role=role, ranks=ranks)
    fake_core.record(
        "publish", role=role, world_rank=ranks and ranks.world_rank, gpu_id=ranks and ranks.gpu_id
    )


def assert_published(server_args, *, role):
    if _CONTEXT.get("server_args") is not server_args or _CONTEXT.get("role") != role:
        raise RuntimeError(f"config not published for role {role!r}")


def _published():
    if "server_args" not in _CONTEXT:
        raise RuntimeError("read before publish()")
    return _CONTEXT["server_args"], _CONTEXT["ranks"]


def get_device():
    _, ranks = _published()
    return SimpleNamespace(device="cpu", gpu_id=ranks.gpu_id if ranks else None)


def get_schedule():
    args, _ = _published()
    return SimpleNamespace(
        mem_fraction_static=args.mem_fraction_static or 0.88, page_size=args.page_size or 1
    )
