"""``torch`` backend: the reference computation, serving any device torch runs on.

Reference speed, not fast: it exists so that every call has a correct path (CPU machines,
unsupported shapes on a GPU) and as the last link of every fallback chain.
"""

from __future__ import annotations

from ..problem import LaunchArgs, Problem
from ..reference import logits_into


class TorchBackend:
    name = "torch"
    knobs: tuple[str, ...] = ()

    def unsupported(self, problem: Problem) -> str | None:
        return None

    def candidates(self, problem: Problem) -> list[dict]:
        return [{}]

    def default_config(self, problem: Problem) -> dict:
        return {}

    def launch(self, args: LaunchArgs, config: dict) -> None:
        logits_into(
            args.out, args.q, args.kv_cache, args.weights, args.context_lens, args.block_table,
            args.max_model_len, kv_block_size=args.kv_block_size, preshuffle=args.preshuffle,
        )


BACKEND = TorchBackend()
