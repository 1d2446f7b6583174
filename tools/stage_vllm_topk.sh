#!/bin/bash
# Stage vLLM's top-k kernels (top_k_per_row_decode, persistent_topk) from a vLLM git dir for a
# same-run comparison on the GPU machine. Nothing staged is ever committed.
#   tools/stage_vllm_topk.sh VLLM_GITDIR DEST        (VLLM_REV=<commit> picks a revision; default HEAD)
# DEST should be .vllm_topk (ignored by .gitignore); name it in `carry` on the GPU machine, then
#   python DEST/build.py && python -m paged_mqa_logits bench --topk --vllm DEST
# The entry files are found by the functions they define, and every header they include with
# quotes is copied after them, so the script follows vLLM's layout from revision to revision.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VLLM_GITDIR DEST" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
python3 "$HERE/vllm_topk/stage.py" "$1" "$2" --rev "${VLLM_REV:-HEAD}"
cp "$HERE/vllm_topk/build.py" "$2/build.py"
du -sh "$2"
