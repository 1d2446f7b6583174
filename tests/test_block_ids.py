"""Block-table ids: every id a call walks is checked on CPU (and on devices with
PAGED_MQA_LOGITS_CHECK=1); unchecked ids are clamped by the reference, like the kernels."""

import os
import subprocess
import sys

import pytest
import torch

from op_cases import positional
from paged_mqa_logits import PagedMQAArgumentError, paged_mqa_logits, validate
from paged_mqa_logits.reference import make_inputs, reference_logits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base(lens=(40, 17), lens_2d=True, max_model_len=48):
    return make_inputs(2, 2, 32, list(lens), kv_block_size=16, max_model_len=max_model_len, lens_2d=lens_2d)


def run(inp, backend=None):
    return paged_mqa_logits(*positional(inp), backend=backend)


@pytest.mark.parametrize("backend", [None, "torch", "triton"])
@pytest.mark.parametrize("bad", [-1, "num_blocks", 2**31 - 1, -(2**31)])
def test_walked_id_out_of_range_is_rejected(bad, backend):
    inp = base()
    num_blocks = inp["kv_cache"].shape[0]
    value = num_blocks if bad == "num_blocks" else bad
    inp["kv_indices"][1, 1] = value  # sequence 1 (17 tokens) walks columns 0 and 1
    before = inp["out_logits"].clone()
    with pytest.raises(PagedMQAArgumentError) as err:
        run(inp, backend)
    message = str(err.value)
    assert "`kv_indices`" in message and f"[0, num_blocks={num_blocks})" in message
    assert f"{value} at (b=1, column=1)" in message, message
    assert torch.equal(before.view(torch.int32), inp["out_logits"].view(torch.int32))


def test_ids_past_the_walked_blocks_are_not_checked():
    """Entries past ceil(valid_len / KVBlockSize) are never read: junk there is fine."""
    inp = base()
    assert int(inp["kv_indices"][1, 2]) == -1  # make_inputs pads with -1
    inp["kv_indices"][1, 2] = 2**31 - 1
    run(inp)


def test_walk_follows_the_row_rules():
    """1-D lengths walk ceil(L_b / kv_block_size) blocks; 2-D lengths walk for max_j lens[b, j] (not
    lens[b, 0]); max_model_len cuts the walk."""
    inp = base(lens_2d=False)
    inp["kv_indices"][1, 1] = -1  # L_1 = 17 walks column 1
    with pytest.raises(PagedMQAArgumentError, match=r"-1 at \(b=1, column=1\)"):
        run(inp)
    inp = base()
    inp["context_lens"][1] = torch.tensor([17, 3], dtype=torch.int32)  # row 0 longer than row 1
    inp["kv_indices"][1, 1] = -1
    with pytest.raises(PagedMQAArgumentError, match=r"column=1"):
        run(inp)
    inp = base(max_model_len=16)
    inp["kv_indices"][0, 1] = -1  # past max_model_len: never walked
    run(inp)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_empty_cache_with_lengths_is_rejected_and_without_is_fine(backend):
    inp = base()
    empty = inp["kv_cache"][:0]
    with pytest.raises(PagedMQAArgumentError, match=r"`kv_indices`.*no blocks \(num_blocks 0\)"):
        paged_mqa_logits(*positional(dict(inp, kv_cache=empty)), backend=backend)
    inp["context_lens"].zero_()
    out = paged_mqa_logits(*positional(dict(inp, kv_cache=empty)), backend=backend, clean_logits=True)
    assert torch.isneginf(out[:4, :48]).all()  # nothing is walked, everything is cleaned


def test_device_check_flag_is_parsed_at_import():
    code = "import paged_mqa_logits.validate as v; print(v.CHECK_DEVICE_IDS)"
    for value, expected in (("1", "True"), ("0", "False"), ("", "False")):
        env = dict(os.environ, PAGED_MQA_LOGITS_CHECK=value, PYTHONPATH=ROOT)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == expected
    env = dict(os.environ, PAGED_MQA_LOGITS_CHECK="maybe", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode and "PagedMQAEnvironmentError" in done.stderr and "PAGED_MQA_LOGITS_CHECK" in done.stderr


def test_check_block_ids_is_what_device_checking_runs():
    """The same function serves CPU calls and device calls with the flag set."""
    inp = base()
    args = (inp["context_lens"], inp["kv_indices"], 2, 16, 48, inp["kv_cache"].shape[0])
    validate.check_block_ids(*args)
    inp["kv_indices"][0, 2] = -7
    with pytest.raises(PagedMQAArgumentError, match=r"-7 at \(b=0, column=2\)"):
        validate.check_block_ids(*args)


def test_reference_clamps_unchecked_ids():
    """The unchecked (GPU) rule: ids are clamped into [0, num_blocks - 1]."""
    inp = base()
    num_blocks = inp["kv_cache"].shape[0]
    wild = inp["kv_indices"].clone()
    wild[0, 0], wild[0, 1], wild[1, 1] = -5, num_blocks + 3, 2**31 - 1
    clamped = wild.clamp(0, num_blocks - 1)
    common = dict(kv_block_size=16, preshuffle=False)
    lhs = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], wild, 48, **common)
    rhs = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], clamped, 48, **common)
    assert torch.equal(lhs, rhs) and torch.isfinite(lhs).any()
