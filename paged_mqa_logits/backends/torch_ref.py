"""``torch`` backend: the reference computation, serving any device torch runs on.

Reference speed, not fast: it exists so that every call has a correct path (CPU machines,
unsupported shapes on a GPU) and as the last link of every fallback chain.

What it computes is the contract of every backend (:func:`paged_mqa_logits.reference.logits_into`):

* ``logits = kv_scale * sum_h weights[h] * relu(dot(q_h, k))`` in fp32, the scale applied after
  the head sum (MXFP4 inputs: the dot of the dequantised values, no per-token scale; bf16
  logits: the fp32 logit rounded once), ``relu(x) = maxNum(x, 0)`` (IEEE 754 maxNum, the GPU ``max`` instructions): a
  NaN dot (NaN in ``q`` or a key) contributes 0; NaN weights or scales propagate, and an
  infinite or negative scale multiplies the head sum by IEEE rules (``inf * 0 = NaN``);
* a block id outside ``[0, num_blocks)`` that validation did not check (device tensors without
  ``PAGED_MQA_LOGITS_CHECK=1``) is clamped into ``[0, num_blocks - 1]``: it reads a wrong block,
  never memory outside the cache. CPU calls never get here with such an id (validation rejects it).
"""

from __future__ import annotations

from ..problem import LaunchArgs, Problem, Target
from ..reference import logits_into
from . import check_knob_space


class TorchBackend:
    name = "torch"
    knobs: tuple[str, ...] = ()
    KNOB_SPACE: dict = {}

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None:
        return check_knob_space(self.name, config, self.KNOB_SPACE)

    def unsupported(self, problem: Problem) -> str | None:
        return None

    def unavailable(self, target: Target) -> str | None:
        return None  # torch runs wherever the tensors are

    def candidates(self, problem: Problem) -> list[dict]:
        return [{}]

    def default_config(self, problem: Problem) -> dict:
        return {}

    def launch(self, args: LaunchArgs, config: dict) -> None:
        key = args.problem.shape_key
        logits_into(
            args.out, args.q, args.kv_cache, args.weights, args.context_lens, args.block_table,
            args.max_model_len, kv_block_size=key.kv_block_size, preshuffle=key.preshuffle,
            q_scale=args.q_scale,
        )


BACKEND = TorchBackend()
