"""The FlyDSL launcher of the kernel in ``algorithm.py``: ``@flyc.kernel`` + ``@flyc.jit``, one
compiled specialisation per :class:`KernelPlan`, and the guarded launch path's last step.

Imports flydsl (only the launch and compile paths import this module).
"""

# No ``from __future__ import annotations``: FlyDSL reads real annotation objects.

import functools

import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith

from . import ir as flydsl_ops
from ...schedule import BALANCED
from .algorithm import ARG_NAMES, KernelBody, launch_arguments
from .plan import KernelPlan


@functools.lru_cache(maxsize=None)
def launcher(plan: KernelPlan):
    """The ``@flyc.jit`` launcher of ``plan`` (cached: one compiled kernel per plan).

    Arguments, in order: the seven tensors (q and kv as uint8 views; q_scale the MXFP4 query
    exponents, or a stand-in an fp8 kernel never reads), then the int32 scalars of
    :data:`ARG_NAMES`, then the stream. Grid = ``algorithm.grid``: (grid_x, 1) persistent programs
    (balanced) or (grid_x splits, batch) (split); ``plan.threads`` threads (256, or 512 with
    ``WaveRoles=split``).
    """

    @flyc.kernel(name=plan.name, known_block_size=[plan.threads, 1, 1])
    def paged_mqa_logits_kernel(
        q: fx.Tensor, kv: fx.Tensor, weights: fx.Tensor, out: fx.Tensor, lens: fx.Tensor, table: fx.Tensor,
        q_scale: fx.Tensor,
        stride_q_b: fx.Int32, stride_q_j: fx.Int32, stride_q_h: fx.Int32, stride_block: fx.Int32,
        stride_w: fx.Int32, stride_out: fx.Int32, stride_lens_b: fx.Int32, stride_lens_j: fx.Int32,
        stride_table: fx.Int32, max_model_len: fx.Int32, max_blocks: fx.Int32, grid_x: fx.Int32,
        batch: fx.Int32, stride_qs_b: fx.Int32, stride_qs_j: fx.Int32,
    ):
        values = (q, kv, weights, out, lens, table, q_scale, stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w,
                  stride_out, stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, grid_x,
                  batch, stride_qs_b, stride_qs_j)
        KernelBody(plan, flydsl_ops, dict(zip(ARG_NAMES, values))).run()

    @flyc.jit
    def launch(
        q: fx.Tensor, kv: fx.Tensor, weights: fx.Tensor, out: fx.Tensor, lens: fx.Tensor, table: fx.Tensor,
        q_scale: fx.Tensor,
        stride_q_b: fx.Int32, stride_q_j: fx.Int32, stride_q_h: fx.Int32, stride_block: fx.Int32,
        stride_w: fx.Int32, stride_out: fx.Int32, stride_lens_b: fx.Int32, stride_lens_j: fx.Int32,
        stride_table: fx.Int32, max_model_len: fx.Int32, max_blocks: fx.Int32, grid_x: fx.Int32,
        batch: fx.Int32, stride_qs_b: fx.Int32, stride_qs_j: fx.Int32, stream: fx.Stream = fx.Stream(None),
    ):
        workgroups_x = arith.index_cast(ir.IndexType.get(), fx.as_ir_value(grid_x))
        workgroups_y = (arith.index_cast(ir.IndexType.get(), fx.as_ir_value(batch)) if plan.schedule != BALANCED
                        else arith.constant(ir.IndexType.get(), 1))
        paged_mqa_logits_kernel(
            q, kv, weights, out, lens, table, q_scale, stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w,
            stride_out, stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, grid_x, batch,
            stride_qs_b, stride_qs_j,
        ).launch(grid=(workgroups_x, workgroups_y, 1), block=(plan.threads, 1, 1), stream=stream)

    launch.compile_hints = {"waves_per_eu": plan.wave_per_eu}
    return launch


_COMPILED: dict = {}


def launch_plan(plan: KernelPlan, args, grid_x: int) -> None:
    """Launch ``plan`` on the current stream. The first call of a plan compiles (and launches);
    later calls reuse the compiled function without re-tracing."""
    values = launch_arguments(args, grid_x) + (torch.cuda.current_stream(),)
    compiled = _COMPILED.get(plan)
    if compiled is None:
        _COMPILED[plan] = flyc.compile(launcher(plan), *values)
    else:
        compiled(*values)
