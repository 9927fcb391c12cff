"""The torchtitan suite holds every published TorchTitan measurement of the reference tables, with provenance.

Published facts (typed here from the sources, not from the records):
- pytorch/torchtitan docs/performance.md at 6a6f755 (2024-12-03): 64 A100 80GB, FSDP2, Llama 3 (seq 8192) and Llama 2
  (seq 4096) tables; the two Llama 2 70B batch-2 selective-checkpointing OOM rows are in the same file at 559a52676
  (2024-04-16).
- pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: Llama 3.1 8B, FSDP, local batch 2,
  8 and 128 H100 96GB HBM2e (8 per Grand Teton host, 400 Gb/s RDMA per GPU), TPS/GPU read at iteration 90.
- pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: 4 and 8 hosts of 8 H200, local batch 2,
  torch.compile + Float8, TPS/GPU and memory at iteration 100.
"""

from pathlib import Path

import pytest

from phantora.groundtruth.checks import check_record
from phantora.groundtruth.store import config_key, load_suite
from phantora.models import load_model
from phantora.paths import groundtruth_dir

# (model, local batch, checkpointing, WPS, MFU %) ; None = OOM
A100_LLAMA3 = [("llama3-8b", 1, "selective-layer", 2904, 56.8), ("llama3-8b", 1, "selective-op", 2973, 58.2),
               ("llama3-70b", 1, "full", 331, 51.7)]
A100_LLAMA2 = [("llama2-13b", 2, "none", 2162, 61.1), ("llama2-13b", 2, "selective-layer", 1914, 54.1),
               ("llama2-13b", 2, "selective-op", 1904, 53.8), ("llama2-70b", 2, "selective-layer", None, None),
               ("llama2-70b", 2, "selective-op", None, None), ("llama2-70b", 1, "selective-op", 355, 50.8),
               ("llama2-70b", 2, "full", 353, 50.5)]
# (GPUs, compile, float8, TPS/GPU, memory GiB)
H100 = [(8, False, False, 5762, 82.4), (8, True, False, 6667, 77.0), (8, True, True, 8532, 76.8),
        (128, False, False, 5605, 67.0), (128, True, False, 6514, 62.0), (128, True, True, 8380, 61.8)]
H200 = [(4, 10938, 47.96), (8, 10753, 46.97)]     # (hosts, TPS/GPU, memory GiB)
A100_PEAK_BF16 = 312e12                            # A100 datasheet, dense BF16 tensor


@pytest.fixture(scope="module")
def records():
    return [r for _, r in load_suite("torchtitan", groundtruth_dir())]


def _find(records, **want):
    def match(r):
        wl, hw = r.workload, r.hardware
        got = {"gpu": hw.gpu, "gpus": hw.gpus, "model": wl.model, "micro_batch": wl.micro_batch,
               "ac": wl.activation_checkpointing, "compile": wl.compile, "float8": wl.float8}
        return all(got[k] == v for k, v in want.items())
    found = [r for r in records if match(r)]
    assert len(found) == 1, f"expected one record for {want}, found {[r.id for r in found]}"
    return found[0]


def test_every_published_a100_row_is_recorded(records):
    for rows, seq in ((A100_LLAMA3, 8192), (A100_LLAMA2, 4096)):
        for model, b, ac, wps, mfu in rows:
            r = _find(records, gpu="a100-sxm-80gb", gpus=64, model=model, micro_batch=b, ac=ac)
            assert r.workload.seq_len == seq
            assert r.workload.global_batch == 64 * b
            assert r.workload.parallelism.dp_shard == 64
            assert not r.workload.compile and not r.workload.float8
            if wps is None:
                assert r.metrics.oom and r.metrics.tokens_per_s_per_gpu is None
                assert r.source.commit.startswith("559a52676")
            else:
                assert not r.metrics.oom
                assert r.metrics.tokens_per_s_per_gpu == wps and r.metrics.mfu_percent == mfu
                assert r.source.commit == "6a6f755d2d7fd65ea6013324ae130306a0761e2c"


def test_every_published_h100_and_h200_row_is_recorded(records):
    for gpus, comp, f8, tps, mem in H100:
        r = _find(records, gpu="h100-96gb-hbm2e", gpus=gpus, compile=comp, float8=f8)
        assert (r.hardware.hosts, r.hardware.gpus_per_host) == (gpus // 8, 8)
        assert (r.workload.micro_batch, r.workload.global_batch) == (2, 2 * gpus)
        assert r.metrics.tokens_per_s_per_gpu == tps and r.metrics.memory_gib == mem
        assert r.metrics.at_iteration == 90
        assert r.source.file == "benchmarks/llama3_h100_202412_torchtitan.md"
        assert r.workload.framework_version.startswith("9dec370")
        if gpus > 8:
            assert r.hardware.inter_host_gbps_per_gpu == 400
    for hosts, tps, mem in H200:
        r = _find(records, gpu="h200-sxm-141gb", gpus=8 * hosts)
        assert r.metrics.tokens_per_s_per_gpu == tps and r.metrics.memory_gib == mem
        assert r.workload.compile and r.workload.float8 and r.workload.micro_batch == 2


def test_suite_holds_nothing_else_and_no_configuration_twice(records):
    assert len(records) == len(A100_LLAMA3) + len(A100_LLAMA2) + len(H100) + len(H200)
    keys = [config_key(r) for r in records]
    assert len(set(keys)) == len(keys)


def test_provenance_is_complete(records):
    for r in records:
        s = r.source
        assert s.repository == "pytorch/torchtitan"
        assert s.commit and s.commit in s.url and s.file in s.url, r.id
        assert s.section, r.id
        assert r.id == Path(f"{r.id}.toml").stem
        # what the source leaves open is said to be assumed
        if r.hardware.gpu == "a100-sxm-80gb":
            assert "hardware.inter_host_gbps_per_gpu" in r.assumptions


def _llama_params(m) -> int:
    """Parameters from the shape alone: embeddings, attention (GQA), SwiGLU MLP, norms."""
    hd = m.dim // m.n_heads
    attn = m.dim * m.dim * 2 + 2 * m.dim * m.n_kv_heads * hd
    return 2 * m.vocab_size * m.dim + m.n_layers * (attn + 3 * m.dim * m.ffn_dim + 2 * m.dim) + m.dim


def test_a100_mfu_counts_the_embedding(records):
    """The A100 tables' MFU is WPS × (6 × all parameters + 12·L·d·seq) / 312 TFLOP/s, as the records declare."""
    for r in records:
        if r.hardware.gpu != "a100-sxm-80gb" or r.metrics.oom:
            continue
        m = load_model(r.workload.model)
        fpt = 6 * _llama_params(m) + 12 * m.n_layers * m.dim * r.workload.seq_len
        mfu = 100 * r.metrics.tokens_per_s_per_gpu * fpt / A100_PEAK_BF16
        assert mfu == pytest.approx(r.metrics.mfu_percent, rel=2e-3), r.id
        assert r.metrics.mfu_counts_embedding


def test_records_pass_the_plausibility_checks(records):
    for r in records:
        rep = check_record(r)
        assert rep.ok, rep.problems
