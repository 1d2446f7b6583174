"""``python -m paged_mqa_logits.bench``: the same command as ``python -m paged_mqa_logits bench``."""

import sys

from .cli import main

sys.exit(main())
