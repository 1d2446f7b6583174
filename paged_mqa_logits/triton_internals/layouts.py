"""Gluon distributed layouts as linear layouts, computed on the host with no GPU.

Triton internals touched: ``triton._C.libtriton`` (``ir.context``, ``ir.load_dialects``,
``gluon_ir.GluonOpBuilder.to_linear_layout``) and a layout object's ``_to_ir``. Verified on
Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearBases:
    """Where each register, lane and warp index bit of a layout lands: ``reg_bases[i]`` is the
    tensor coordinate bit ``i`` of the register index selects (XOR-combined), and so on."""

    reg_bases: list
    lane_bases: list
    warp_bases: list


def linear_bases(layout, shape) -> LinearBases:
    """The linear layout of ``layout`` over a tensor of ``shape`` (the layout algebra needs an
    MLIR context, not a GPU)."""
    from triton._C.libtriton import gluon_ir, ir

    context = ir.context()
    ir.load_dialects(context)
    builder = gluon_ir.GluonOpBuilder(context)
    linear = builder.to_linear_layout(layout._to_ir(builder), list(shape))
    return LinearBases([list(b) for b in linear.reg_bases], [list(b) for b in linear.lane_bases],
                       [list(b) for b in linear.warp_bases])
