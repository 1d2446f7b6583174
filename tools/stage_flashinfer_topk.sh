#!/bin/bash
# Stage FlashInfer's top-k (its ragged transform, include/flashinfer/topk.cuh) from a FlashInfer git dir
# for a same-run comparison on the GPU machine. Nothing staged is ever committed.
#   tools/stage_flashinfer_topk.sh FLASHINFER_GITDIR DEST  (FLASHINFER_REV=<commit> picks a revision; default HEAD)
# DEST should be .flashinfer_topk (ignored by .gitignore); name it in `carry` on the GPU machine, then
#   python DEST/build.py && python -m paged_mqa_logits bench --topk --flashinfer DEST
# The headers our binding includes are copied with every header they include with quotes, then our
# binding, its ctypes wrapper and build.py; DEST is written whole or not at all (tools/flashinfer_topk/stage.py).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 FLASHINFER_GITDIR DEST" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
python3 "$HERE/flashinfer_topk/stage.py" "$1" "$2" --rev "${FLASHINFER_REV:-HEAD}"
du -sh "$2"
