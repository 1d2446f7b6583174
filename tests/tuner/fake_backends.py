"""A test-only backend whose candidates misbehave on purpose, for the tuner's isolation tests.

Loaded into the tuner (and its worker processes) through
``PAGED_MQA_LOGITS_EXTRA_BACKENDS=fake_backends:BACKEND`` (this directory is on ``sys.path``
under pytest). Candidate ``mode``:

* ``ok``: the reference computation (correct);
* ``wrong``: the logits of weights scaled by 1.5, at exactly the right positions (fails calc_diff);
* ``scribble``: correct, plus a write past the visible range (fails the untouched check);
* ``raise``: raises a Python exception;
* ``crash``: kills its process without a word (as a segfault would);
* ``hang``: never returns.

``BACKEND`` offers all six as tuner candidates; ``IN_PROCESS`` only the ones that cannot take
the calling process down (for tests that run the bench in the test process).
"""

import os
import time

from paged_mqa_logits.reference import logits_into

MODES = ("ok", "wrong", "scribble", "raise", "crash", "hang")


class MisbehavingBackend:
    name = "fake"
    knobs = ("mode",)

    def __init__(self, modes=MODES):
        self.modes = modes

    def unsupported(self, problem):
        return None

    def unavailable(self, target):
        return None if target.device_type == "cpu" else "test backend: CPU only"

    def candidates(self, problem):
        return [{"mode": m} for m in self.modes]

    def default_config(self, problem):
        return {"mode": "ok"}

    def launch(self, args, config):
        mode = config.get("mode", "ok")
        if mode == "crash":
            os._exit(17)
        if mode == "hang":
            while True:
                time.sleep(1)
        if mode == "raise":
            raise RuntimeError("fake backend: asked to raise")
        weights = args.weights * 1.5 if mode == "wrong" else args.weights
        logits_into(args.out, args.q, args.kv_cache, weights, args.context_lens, args.block_table,
                    args.max_model_len, kv_block_size=args.problem.shape_key.kv_block_size,
                    preshuffle=args.problem.shape_key.preshuffle)
        if mode == "scribble":
            args.out[: args.problem.rows, args.max_model_len:] = 0.0


BACKEND = MisbehavingBackend()
IN_PROCESS = MisbehavingBackend(("ok", "wrong", "scribble", "raise"))
