"""warmup(): the calls a problem family can make (table rows, nearest rows, defaults, fallbacks),
a CPU run with its summary, and on a GPU: nothing compiles during capture afterwards."""

import dataclasses

import pytest
import torch

from paged_mqa_logits import PagedMQAArgumentError, reload_tuned_table
from paged_mqa_logits.aot.warmup import Family, enumerate_calls, table_families, warm_inputs, warmup

TABLE = """\
arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,SplitKV,num_warps,num_stages,us,provenance
sm_90,132,64,128,64,0,1,1,any,triton,32,,0,4,3,,prior:test
sm_90,132,64,128,64,0,16,1,any,triton,64,,0,8,3,,prior:test
sm_90,132,64,128,64,0,16,1,4096,triton,128,,0,8,2,,prior:test
sm_90,132,64,128,64,0,4,2,any,triton,64,,2,4,3,,prior:test
cpu,0,64,128,16,1,2,1,any,torch,,,,,,,prior:test
"""


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "warm_tuned.csv"
    path.write_text(TABLE)
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", str(path))
    reload_tuned_table()


def test_table_families_cover_the_tuned_rows(table):
    (fam,) = table_families("sm_90", max_model_len=8192)
    assert (fam.heads, fam.kv_block_size, fam.preshuffle, fam.cu_num) == (64, 64, False, 132)
    assert fam.next_n == (1, 2) and fam.batch_sizes == tuple(range(1, 17))
    assert fam.context_hints == (None, 4096) and fam.lens_2d == (True, False)


def test_enumerate_calls_follows_dispatch_and_adds_fallbacks(table):
    fam = Family(heads=64, kv_block_size=64, next_n=(1,), batch_sizes=(1, 3, 16, 200), context_hints=(None, 4096),
                 max_model_len=8192)
    calls = enumerate_calls(fam, arch="sm_90", cu_num=132, hypothetical=True)
    picked = {(c.problem.shape_key.batch, c.problem.context): c.config["ChunkK"] for c in calls if c.kind == "dispatch"}
    # exact rows, nearest tuned batch (log2 distance, ties to the larger), context rows with a hint
    assert picked == {(1, None): 32, (3, None): 32, (16, None): 64, (200, None): 64,
                      (1, 4096): 128, (3, 4096): 128, (16, 4096): 128, (200, 4096): 128}
    fallbacks = {c.backend for c in calls if c.kind == "fallback"}
    assert "torch" in fallbacks and "triton" not in fallbacks  # sm_90 chain: gluon -> triton -> torch, minus the pick
    assert fallbacks <= {"gluon", "torch"}
    no_row = enumerate_calls(Family(heads=32, kv_block_size=64, batch_sizes=(8,), max_model_len=1024), arch="sm_90",
                             cu_num=132, hypothetical=True, include_fallbacks=False)
    assert [c.kind for c in no_row] == ["dispatch"]  # the per-arch default when no row exists


def test_warmup_on_cpu_runs_each_choice_once_and_summarises(table):
    summary = warmup(64, 16, True, next_n=(1, 2), batch_sizes=4, max_model_len=64, lens_2d=(True, False),
                     device="cpu", include_fallbacks=False, progress=False)
    assert summary.arch == "cpu" and summary.device == "cpu"
    assert summary.problems == 2 * 4 * 2
    assert summary.calls_run == 4  # torch backend: one call per (next_n, layout)
    assert [(c["backend"], c["kind"], c["calls"]) for c in summary.compiled] == [("torch", "dispatch", 4)]
    assert summary.missing == [] and summary.kernels == 0
    assert "torch" in summary.describe() and "16 problem keys" in summary.describe()


def test_warmup_on_cpu_includes_the_fallback_chain(table):
    summary = warmup(64, 16, True, next_n=1, batch_sizes=(2,), max_model_len=32, device="cpu", progress=False)
    kinds = {(c["backend"], c["kind"]) for c in summary.compiled}
    assert kinds == {("torch", "dispatch"), ("triton", "fallback")}  # triton runs under the interpreter here
    assert summary.calls_run == 2


def test_warmup_rejects_a_too_small_workspace(table):
    with pytest.raises(ValueError, match="workspace"):
        warmup(64, 16, True, batch_sizes=4, max_model_len=64, device="cpu", progress=False,
               workspace=torch.empty(2, 64))


def test_table_families_keep_formats_apart(tmp_path, monkeypatch):
    path = tmp_path / "fmt_tuned.csv"
    header, *rows = TABLE.replace("next_n,context", "next_n,kv_format,logits_dtype,context").splitlines()
    rows = [r.replace(",1,any,", ",1,fp8,fp32,any,").replace(",2,any,", ",2,fp8,fp32,any,")
            .replace(",1,4096,", ",1,fp8,fp32,4096,") for r in rows]
    rows.append("sm_90,132,64,128,64,0,8,1,fp4,bf16,any,triton,64,,0,4,3,,prior:test")
    path.write_text("\n".join([header] + rows) + "\n")
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", str(path))
    reload_tuned_table()
    families = table_families("sm_90", max_model_len=8192)
    assert [(f.kv_format, f.logits_dtype, f.batch_sizes[-1]) for f in families] == [("fp4", "bf16", 8),
                                                                                   ("fp8", "fp32", 16)]
    calls = enumerate_calls(families[0], arch="sm_90", cu_num=132, hypothetical=True, include_fallbacks=False)
    assert {(c.problem.shape_key.kv_format, c.problem.shape_key.logits_dtype) for c in calls} == {("fp4", "bf16")}
    assert {c.backend for c in calls} == {"triton"}


def test_warm_inputs_of_an_fp4_bf16_problem(table):
    fam = Family(heads=64, kv_block_size=64, batch_sizes=(3,), max_model_len=256, kv_format="fp4", logits_dtype="bf16")
    (call,) = enumerate_calls(fam, arch="sm_90", cu_num=132, hypothetical=True, include_fallbacks=False)
    meta = warm_inputs(call.problem, device="meta", workspace=torch.empty(3, 256, dtype=torch.bfloat16, device="meta"))
    assert meta.q.shape == (3, 1, 64, 64) and meta.q_scale.shape == (3, 1, 64) and meta.kv_cache.shape[-1] == 68
    assert meta.out.dtype == torch.bfloat16
    cpu = dataclasses.replace(call.problem, arch="cpu", cu_num=0)
    real = warm_inputs(cpu, device="cpu", workspace=torch.empty(3, 256, dtype=torch.bfloat16))
    assert real.problem == cpu and real.q_scale is not None
    with pytest.raises(ValueError, match=r"workspace must hold bf16 logits \(torch.bfloat16\), got torch.float32"):
        warm_inputs(cpu, device="cpu", workspace=torch.empty(3, 256))


def test_warmup_on_cpu_with_mxfp4_and_bf16(table):
    summary = warmup(64, 16, True, next_n=(1, 2), batch_sizes=2, max_model_len=64, device="cpu", progress=False,
                     kv_format="fp4", logits_dtype="bf16")
    assert summary.problems == 4 and summary.calls_run >= 2 and summary.missing == []


@pytest.mark.gpu
@pytest.mark.parametrize("kv_format,logits_dtype", [("fp8", "fp32"), ("fp4", "fp32"), ("fp8", "bf16"), ("fp4", "bf16")])
def test_after_warmup_capture_compiles_nothing(kv_format, logits_dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm GPU; none present (CPU-only machine)")
    from triton import knobs

    from paged_mqa_logits.torch_op import paged_mqa_logits

    sizes, max_model_len = (1, 2, 3, 8, 16, 17), 2048
    summary = warmup(64, 64, False, next_n=(1, 2), batch_sizes=sizes, max_model_len=max_model_len, progress=False,
                     kv_format=kv_format, logits_dtype=logits_dtype)
    assert summary.missing == [], summary.describe()
    fam = Family(heads=64, kv_block_size=64, next_n=(1, 2), batch_sizes=sizes, max_model_len=max_model_len,
                 kv_format=kv_format, logits_dtype=logits_dtype)
    workspace = torch.empty((max(sizes) * 2, max_model_len), dtype=fam.workspace_dtype, device="cuda")
    from paged_mqa_logits.aot.warmup import enumerate_calls as calls_of
    from paged_mqa_logits.arch import detect

    info = detect("cuda")
    compiles = []
    knobs.compilation.listener = lambda **kw: compiles.append(kw["metadata"]["name"])
    try:
        for call in calls_of(fam, arch=info.arch, cu_num=info.cu_num, include_fallbacks=False):
            args = warm_inputs(call.problem, device="cuda", workspace=workspace)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                paged_mqa_logits(args.q, args.kv_cache, args.weights, args.out, args.context_lens, args.block_table,
                                 max_model_len, False, 64, q_scale=args.q_scale)
            graph.replay()
        torch.cuda.synchronize()
    finally:
        knobs.compilation.listener = None
    assert compiles == [], f"compiled during capture: {compiles}"


@pytest.mark.parametrize("change,argument", [(dict(max_model_len=1 << 40), "max_model_len"),
                                             (dict(max_model_len=-1), "max_model_len"),
                                             (dict(max_model_len=0), "max_model_len"),
                                             (dict(heads=24), "heads"), (dict(kv_block_size=48), "kv_block_size"),
                                             (dict(next_n=9), "next_n"), (dict(next_n=[1, "2"]), "next_n"),
                                             (dict(batch_sizes=1 << 40), "batch_sizes"),
                                             (dict(batch_sizes=[0]), "batch_sizes"), (dict(preshuffle=1), "preshuffle")])
def test_warmup_checks_its_family_before_allocating(change, argument):
    kwargs = dict(heads=64, kv_block_size=64, preshuffle=False, next_n=1, batch_sizes=2, max_model_len=256)
    kwargs.update(change)
    with pytest.raises(PagedMQAArgumentError, match=f"paged_mqa_logits.warmup: argument `{argument}`: expected"):
        warmup(kwargs.pop("heads"), kwargs.pop("kv_block_size"), device="cpu", progress=False, **kwargs)
