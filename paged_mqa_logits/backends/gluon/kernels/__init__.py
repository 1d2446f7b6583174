"""Device code of the ``gluon`` backend: ``@gluon.jit`` kernels and the constexpr layouts they
need. A kernel module imports Triton, the version shims of ``triton_internals`` and other device
modules; never a host module (knobs, resource rules, launch plans), which import it instead.
"""
