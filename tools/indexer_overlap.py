"""What the logits' precision does to the indexer's selection (run on a GPU).

The indexer keeps the ``k`` highest logits of each row. For each shape this draws queries, keys
and weights in fp32, quantises them as the bench does (queries cast to e4m3, keys per token with
their scale), and computes the logits of the quantised inputs four ways: our kernel with the fp32
head sum and with the tensor-core head sum (``HeadSum=tensor``), DeepGEMM's (if importable), and
float64 on the dequantised inputs. It reports, per row and averaged, how many of each one's top-k
positions are also in the top-k of the float64 logits of the *unquantised* inputs (what the model
means) and of the quantised inputs (where the rounding of the logits alone shows).

    python tools/indexer_overlap.py --out overlap.csv [--k 2048]
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch

from paged_mqa_logits import op
from paged_mqa_logits.reference import pack_kv_cache, quantize_fp8

#: (heads, next_n, batch, context): DeepGEMM's test shapes for the decode kernel, contexts past k
SHAPES = ((64, 1, 16, 8192), (64, 2, 16, 8192), (64, 4, 16, 8192), (64, 4, 8, 32768), (32, 2, 16, 8192),
          (32, 4, 16, 16384))
BLOCK = 64


def _inputs(heads: int, next_n: int, batch: int, context: int, gen: torch.Generator) -> dict:
    dev = "cuda"
    q = torch.randn(batch, next_n, heads, 128, generator=gen, device=dev)
    keys = torch.randn(batch, context, 128, generator=gen, device=dev)
    weights = torch.randn(batch * next_n, heads, generator=gen, device=dev) / heads ** 0.5
    blocks = context // BLOCK
    keys_q, scales = quantize_fp8(keys.reshape(batch * blocks, BLOCK, 128))
    table = torch.arange(batch * blocks, dtype=torch.int32, device=dev).reshape(batch, blocks)
    lens = torch.full((batch, next_n), context, dtype=torch.int32, device=dev)
    lens -= torch.arange(next_n - 1, -1, -1, dtype=torch.int32, device=dev)[None, :]
    return {"q": q, "keys": keys, "weights": weights, "q_fp8": q.to(torch.float8_e4m3fn),
            "kv_cache": pack_kv_cache(keys_q, scales), "keys_deq": (keys_q.float() * scales[..., None]),
            "context_lens": lens, "kv_indices": table, "max_model_len": context}


def _float64_logits(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[B*next_n, context]``: sum_h w relu(q . k) in float64."""
    b, n, h, d = q.shape
    scores = torch.einsum("bjhd,btd->bjht", q.double(), keys.reshape(b, -1, d).double())
    return (scores.relu() * weights.double().reshape(b, n, h, 1)).sum(2).reshape(b * n, -1)


def _visible(logits: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(logits.shape[1], device=logits.device)
    return torch.where(cols[None, :] < lens.reshape(-1, 1), logits.double(), float("-inf"))


def _overlap(a: torch.Tensor, b: torch.Tensor, k: int) -> float:
    """Mean over rows of |top_k(a) & top_k(b)| / k."""
    rows, width = a.shape
    ta, tb = a.topk(k, dim=1).indices, b.topk(k, dim=1).indices
    hit = torch.zeros(rows, width, dtype=torch.bool, device=a.device)
    hit.scatter_(1, ta, True)
    return float(hit.gather(1, tb).float().mean())


def _ours(inp: dict, head_sum: str) -> torch.Tensor:
    out = torch.empty(inp["context_lens"].shape[0] * inp["context_lens"].shape[1], inp["max_model_len"],
                      device="cuda")
    config = {"variant": "wgmma_pipes", "HeadSum": head_sum, "Overlap": 0, "RowsPerMMA": 1, "Consumers": 4,
              "RowSplit": 1, "CtasPerSM": 1, "num_stages": 3, "KeyCopy": "tma", "Schedule": "balanced"}
    op.paged_mqa_logits_eager(inp["q_fp8"], inp["kv_cache"], inp["weights"], out, inp["context_lens"],
                              inp["kv_indices"], inp["max_model_len"], False, BLOCK, backend="gluon", config=config)
    return out


def _deepgemm(inp: dict) -> torch.Tensor | None:
    try:
        import deep_gemm
    except Exception:
        return None
    lens = inp["context_lens"]
    next_n = lens.shape[1]
    slots = torch.cuda.get_device_properties(0).multi_processor_count // (2 if next_n == 4 else 1)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK, slots)
    return deep_gemm.fp8_paged_mqa_logits(inp["q_fp8"], inp["kv_cache"].view(torch.uint8), inp["weights"], lens,
                                          inp["kv_indices"], schedule, inp["max_model_len"], False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows = []
    for heads, next_n, batch, context in SHAPES:
        inp = _inputs(heads, next_n, batch, context, gen)
        lens = inp["context_lens"]
        exact = _visible(_float64_logits(inp["q"], inp["keys"], inp["weights"]), lens)
        quantised = _visible(_float64_logits(inp["q_fp8"].float(), inp["keys_deq"].reshape(batch, context, 128),
                                             inp["weights"]), lens)
        who = {"ours_fp32": _ours(inp, "fp32"), "ours_tensor": _ours(inp, "tensor"), "deepgemm": _deepgemm(inp)}
        for name, logits in who.items():
            if logits is None:
                continue
            logits = _visible(logits, lens)
            rows.append({"gpu": torch.cuda.get_device_name(), "heads": heads, "next_n": next_n, "batch": batch,
                         "context": context, "k": args.k, "who": name,
                         "overlap_unquantised": round(_overlap(exact, logits, args.k), 6),
                         "overlap_quantised": round(_overlap(quantised, logits, args.k), 6)})
            print(rows[-1], flush=True)
        del inp, exact, quantised, who
    with open(args.out, "w", newline="") as f:
        f.write(f"# tools/indexer_overlap.py, torch {torch.__version__}, {torch.cuda.get_device_name()}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
