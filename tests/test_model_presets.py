"""Model presets against published parameter counts, TorchTitan's MFU tables and an independent count of a real
(meta-device) PyTorch model of each shape."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phantora.errors import PhantoraError, PresetError
from phantora.gpus import load_gpu
from phantora.models import FAMILIES, list_models, llama_ffn_dim, load_model, model_dir

PRESETS = ["llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
           "qwen3-30b-a3b", "gpt-oss-20b", "llama3-debug", "llama-tiny"]


def truncated(x: float, digits: int) -> float:
    scale = 10 ** digits
    return int(x * scale) / scale


# ------------------------------------------------------------------------------------------------------ loading
def test_every_required_preset_exists():
    assert set(PRESETS) <= set(list_models())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads(name):
    m = load_model(name)
    assert m.name == name, "the preset id inside the file must match its file name"
    assert m.family in FAMILIES
    assert m.sources["shape"].strip() and m.notes.strip()
    assert m.n_heads % m.n_kv_heads == 0


def test_load_by_path_equals_load_by_name():
    assert load_model(str(model_dir() / "llama3-8b.toml")) == load_model("llama3-8b")


def test_unknown_preset_lists_known_ones():
    with pytest.raises(PresetError) as exc:
        load_model("no-such-model")
    assert "llama3-8b" in str(exc.value)


# --------------------------------------------------------------------------------------- published parameter counts
@pytest.mark.parametrize("name,count", [
    # Exact totals that TorchTitan logs ("size: N total parameters") and the Hugging Face safetensors metadata give.
    ("llama3-8b", 8_030_261_248),
    ("llama2-7b", 6_738_415_616),
    ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192),
    ("mixtral-8x7b", 46_702_792_704),
])
def test_exact_published_parameter_counts(name, count):
    assert load_model(name).num_params() == count


@pytest.mark.parametrize("name,billions,digits", [
    ("llama3-8b", 8.03, 2),       # Meta Llama 3.1 8B model page: 8.03B
    ("llama2-7b", 6.74, 2),       # Llama-2-7b-hf: 6.74B
    ("llama2-70b", 68.98, 2),     # Llama-2-70b-hf: 68.98B ("70B")
    ("llama3-70b", 70.6, 1),      # Llama-3.1-70B: 70.6B
    ("mixtral-8x7b", 46.7, 1),    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7B total
    ("qwen3-30b-a3b", 30.5, 1),   # Qwen3-30B-A3B model card: 30.5B in total
    ("gpt-oss-20b", 20.91, 2),    # gpt-oss model card (2025-08-05), Table 1: 20.91B total
])
def test_total_parameters_round_to_published_size(name, billions, digits):
    assert round(load_model(name).num_params() / 1e9, digits) == pytest.approx(billions)


def test_llama3_405b_is_405b():
    # Llama 3 paper (arXiv:2407.21783): 405B parameters.
    assert load_model("llama3-405b").num_params() == pytest.approx(405e9, rel=5e-3)


def test_mixtral_active_parameters():
    # Mistral AI: "uses 12.9B parameters per token" (embedding and output tables included).
    m = load_model("mixtral-8x7b")
    assert round(m.num_active_params() / 1e9, 1) == pytest.approx(12.9)


def test_qwen3_30b_a3b_active_and_non_embedding_parameters():
    # Qwen3-30B-A3B model card: 3.3B activated (3.35 truncated), 29.9B non-embedding (embedding and output removed).
    m = load_model("qwen3-30b-a3b")
    assert truncated(m.num_active_params() / 1e9, 1) == pytest.approx(3.3)
    assert round((m.num_params() - m.embedding_params() - m.output_params()) / 1e9, 1) == pytest.approx(29.9)


def test_gpt_oss_20b_parameter_breakdown():
    # gpt-oss model card (2025-08-05), parameter table for gpt-oss-20b: MLP 19.12B, attention 0.64B,
    # embed + unembed 1.16B, active 3.61B per token (which leaves the input embedding out).
    m = load_model("gpt-oss-20b")
    assert round(m.n_layers * m.mlp_params_per_layer() / 1e9, 2) == pytest.approx(19.12)
    assert round(m.n_layers * m.attention_params_per_layer() / 1e9, 2) == pytest.approx(0.64)
    assert round((m.embedding_params() + m.output_params()) / 1e9, 2) == pytest.approx(1.16)
    assert round((m.num_active_params() - m.embedding_params()) / 1e9, 2) == pytest.approx(3.61)


@pytest.mark.parametrize("name", [n for n in PRESETS if not load_model(n).is_moe])
def test_dense_models_use_every_parameter(name):
    m = load_model(name)
    assert m.num_active_params() == m.num_params()


# --------------------------------------------------------------------------------------------- FFN recipe
def meta_llama_ffn(dim: int, multiple_of: int, multiplier: float | None) -> int:
    # Meta llama/model.py FeedForward.__init__ (Llama 2 and 3 reference code), written out independently.
    hidden = 4 * dim
    hidden = int(2 * hidden / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@pytest.mark.parametrize("name,intermediate,multiple_of,multiplier", [
    # intermediate_size from the models' config.json; multiple_of / ffn_dim_multiplier from Meta's params.json
    # and TorchTitan's model args.
    ("llama2-7b", 11008, 256, None),
    ("llama2-13b", 13824, 256, None),
    ("llama2-70b", 28672, 4096, 1.3),
    ("llama3-8b", 14336, 1024, 1.3),
    ("llama3-70b", 28672, 4096, 1.3),
    ("llama3-405b", 53248, 4096, 1.2),   # Llama 3 paper Table 3: FFN dimension 53,248
    ("llama3-debug", 768, 256, None),    # torchtitan compute_ffn_hidden_dim(256, multiple_of=256)
])
def test_llama_ffn_dim_follows_the_recipe(name, intermediate, multiple_of, multiplier):
    m = load_model(name)
    assert m.ffn_dim == intermediate
    assert meta_llama_ffn(m.dim, multiple_of, multiplier) == intermediate
    assert llama_ffn_dim(m.dim, multiple_of, multiplier) == intermediate


# ------------------------------------------------------------------------------ independent count on a meta model
class _Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        hd = m.head_size
        self.wq = nn.Linear(m.dim, m.n_heads * hd, bias=m.attn_bias)
        self.wk = nn.Linear(m.dim, m.n_kv_heads * hd, bias=m.attn_bias)
        self.wv = nn.Linear(m.dim, m.n_kv_heads * hd, bias=m.attn_bias)
        self.wo = nn.Linear(m.n_heads * hd, m.dim, bias=m.attn_bias)
        if m.qk_norm:
            self.q_norm, self.k_norm = nn.RMSNorm(hd), nn.RMSNorm(hd)
        if m.attn_sinks:
            self.sinks = nn.Parameter(torch.empty(m.n_heads))
        self.attention_norm, self.ffn_norm = nn.RMSNorm(m.dim), nn.RMSNorm(m.dim)
        if m.num_experts:
            e, f = m.num_experts, m.moe_ffn_dim
            self.router = nn.Linear(m.dim, e, bias=m.moe_bias)
            self.w13 = nn.Parameter(torch.empty(e, 2 * f, m.dim))
            self.w2 = nn.Parameter(torch.empty(e, m.dim, f))
            if m.moe_bias:
                self.b13 = nn.Parameter(torch.empty(e, 2 * f))
                self.b2 = nn.Parameter(torch.empty(e, m.dim))
        else:
            self.w1 = nn.Linear(m.dim, m.ffn_dim, bias=False)
            self.w2 = nn.Linear(m.ffn_dim, m.dim, bias=False)
            self.w3 = nn.Linear(m.dim, m.ffn_dim, bias=False)


def _meta_model(m) -> nn.Module:
    with torch.device("meta"):
        model = nn.Module()
        model.tok_embeddings = nn.Embedding(m.vocab_size, m.dim)
        model.layers = nn.ModuleList(_Block(m) for _ in range(m.n_layers))
        model.norm = nn.RMSNorm(m.dim)
        model.output = nn.Linear(m.dim, m.vocab_size, bias=False)
        if m.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
    return model


@pytest.mark.parametrize("name", PRESETS)
def test_num_params_equals_a_meta_device_model(name):
    m = load_model(name)
    model = _meta_model(m)
    total = sum(p.numel() for p in model.parameters())
    assert m.num_params() == total
    if m.num_experts:
        # A token runs through top_k of num_experts experts: TorchTitan's
        # nparams_experts * top_k // num_experts (get_moe_model_nparams_and_flops).
        experts = sum(p.numel() for n, p in model.named_parameters() if n.split(".")[-1] in ("w13", "w2", "b13", "b2"))
        assert m.num_active_params() == total - experts + experts * m.experts_per_token // m.num_experts


# ---------------------------------------------------------------------------------------------- flops per token
def test_flops_per_token_matches_torchtitan_definition_for_llama3_8b():
    # torchtitan/utils.py get_num_flop_per_token (2024): 6 * num_params(exclude_embedding) + 12 * l * h * q * t,
    # with the 8B's 8,030,261,248 parameters less its 128256 x 4096 embedding table.
    l, h, q, t = 32, 32, 4096 // 32, 8192
    expected = 6 * (8_030_261_248 - 128256 * 4096) + 12 * l * h * q * t
    assert load_model("llama3-8b").flops_per_token(8192) == expected


@pytest.mark.parametrize("name", PRESETS)
def test_attention_term_grows_linearly_with_sequence(name):
    # TorchTitan: 6 * n_layers * n_heads * (qk_head_dim + v_head_dim) * seq_len, the only seq-dependent term.
    m = load_model(name)
    d = m.flops_per_token(2048) - m.flops_per_token(1024)
    assert d == 6 * m.n_layers * m.n_heads * 2 * m.head_size * 1024
    assert m.flops_per_token(1024) - m.attention_flops_per_token(1024) == \
        6 * (m.num_active_params() - m.embedding_params())


def test_gpt_oss_weight_flops_use_the_model_cards_active_count():
    # The model card's 3.61B active parameters are exactly what TorchTitan multiplies by 6 (input embedding out).
    m = load_model("gpt-oss-20b")
    weight_flops = m.flops_per_token(4096) - m.attention_flops_per_token(4096)
    assert round(weight_flops / 6 / 1e9, 2) == pytest.approx(3.61)


def test_moe_flops_count_only_active_experts():
    m = load_model("mixtral-8x7b")
    per_token = m.flops_per_token(4096) - m.attention_flops_per_token(4096)
    assert per_token < 6 * (m.num_params() - m.embedding_params()) / 3


def test_flops_per_token_rejects_bad_seq_len():
    with pytest.raises(PhantoraError):
        load_model("llama-tiny").flops_per_token(0)


# -------------------------------------------------------------------------------- TorchTitan's published MFUs
def test_h100_llama3_8b_mfu_band():
    # TorchTitan benchmarks/llama3_h100_202412_torchtitan.md (2024-12): Llama 3.1 8B, seq 8192, local batch 2,
    # 33% to 39% MFU without Float8 (with or without torch.compile) against the SXM H100 peak.
    # TPS/GPU: 8 GPUs FSDP 5,762 and +compile 6,667; 128 GPUs FSDP 5,605 and +compile 6,514.
    m = load_model("llama3-8b")
    peak = load_gpu("h100-sxm-80gb").peak_flops("bf16")
    mfus = [100 * tps * m.flops_per_token(8192) / peak for tps in (5762, 6667, 5605, 6514)]
    assert all(33 <= round(x) <= 39 for x in mfus), mfus
    assert 33 <= round(100 * 5762 * m.flops_per_token(8192) / 989e12) <= 39   # TorchTitan's own 989e12
    # The pre-April-2024 definition (embedding counted) would put the compiled 8-GPU run at ~41%: outside the band.
    old = [100 * tps * m.flops_per_token(8192, count_embedding=True) / peak for tps in (5762, 6667)]
    assert not all(33 <= round(x) <= 39 for x in old)


# TorchTitan docs/performance.md (commit 6a6f755, 2024-12-03; Llama 2 rows from 559a526, 2024-04-16): 64 x A100 80GB,
# FSDP, bf16; WPS = tokens/s per GPU; sequence length 8192 (Llama 3) and 4096 (Llama 2).
A100_TABLE = [
    ("llama3-8b", 8192, 2904, 56.8),
    ("llama3-8b", 8192, 2973, 58.2),
    ("llama3-70b", 8192, 331, 51.7),
    ("llama2-13b", 4096, 2162, 61.1),
    ("llama2-13b", 4096, 1914, 54.1),
    ("llama2-13b", 4096, 1904, 53.8),
    ("llama2-70b", 4096, 355, 50.8),
    ("llama2-70b", 4096, 353, 50.5),
]


@pytest.mark.parametrize("name,seq,wps,mfu", A100_TABLE)
def test_a100_table_wps_and_mfu_agree(name, seq, wps, mfu):
    # These tables were computed before pytorch/torchtitan#280 (2024-04-26) removed the embedding from the count:
    # MFU = WPS x 6 x (all parameters) + attention, over A100's 312e12.
    m = load_model(name)
    peak = load_gpu("a100-sxm-80gb").peak_flops("bf16")
    computed = 100 * wps * m.flops_per_token(seq, count_embedding=True) / peak
    assert computed == pytest.approx(mfu, rel=0.01)


def test_a100_llama3_rows_need_the_old_definition():
    # With the embedding left out, the Llama 3 8B rows miss their published MFU by ~5%: the two conventions differ.
    m = load_model("llama3-8b")
    computed = 100 * 2904 * m.flops_per_token(8192) / 312e12
    assert computed != pytest.approx(56.8, rel=0.01)


# ------------------------------------------------------------------------------------------------- bytes
def test_param_bytes():
    m = load_model("llama3-8b")
    n = 8_030_261_248
    assert m.param_bytes("bf16") == 2 * n
    assert m.param_bytes(torch.float32) == 4 * n
    assert m.param_bytes("torch.float16") == 2 * n
    assert m.param_bytes("fp8") == n
    with pytest.raises(PhantoraError):
        m.param_bytes("int3")


def test_llama2_70b_does_not_fit_one_a100_in_bf16():
    # 70B parameters x 2 bytes = 138 GB > 80 GB: the reason TorchTitan shards it over 64 GPUs.
    assert load_model("llama2-70b").param_bytes("bf16") > load_gpu("a100-sxm-80gb").memory_bytes


# ----------------------------------------------------------------------------------------- malformed presets
GOOD = """\
name = "m"
family = "llama3"
dim = 256
n_layers = 2
n_heads = 8
n_kv_heads = 4
vocab_size = 1000
ffn_dim = 688
ffn_multiple_of = 16
max_seq_len = 2048
rope_theta = 500000.0
norm_eps = 1e-5

[sources]
shape = "test"
"""

MOE = GOOD.replace('family = "llama3"', 'family = "mixtral"').replace(
    "ffn_multiple_of = 16\n", "num_experts = 8\nexperts_per_token = 2\nmoe_ffn_dim = 688\n")


def write(tmp_path, text, name="m.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_minimal_presets_load(tmp_path):
    assert not load_model(write(tmp_path, GOOD, "dense.toml")).is_moe
    assert load_model(write(tmp_path, MOE, "moe.toml")).is_moe


@pytest.mark.parametrize("text,key", [
    (GOOD.replace("n_layers = 2", "n_layer = 2"), "n_layer"),                           # typo
    (GOOD.replace("vocab_size = 1000\n", ""), "vocab_size"),                            # missing
    (GOOD.replace('family = "llama3"', 'family = "gpt5"'), "family"),                   # unknown family
    (GOOD.replace("n_kv_heads = 4", "n_kv_heads = 3"), "n_kv_heads"),                   # GQA must divide
    (GOOD.replace("ffn_dim = 688", "ffn_dim = 700"), "ffn_dim"),                        # disagrees with recipe
    (GOOD.replace("dim = 256", "dim = 250").replace("ffn_multiple_of = 16\n", ""), "head_dim"),   # 250 % 8 != 0
    (GOOD.replace('shape = "test"', 'other = "x"'), "sources.shape"),                   # no source
    (MOE.replace("experts_per_token = 2", "experts_per_token = 9"), "experts_per_token"),
    (MOE.replace("moe_ffn_dim = 688", "moe_ffn_dim = 512"), "ffn_dim"),
    (GOOD.replace("ffn_multiple_of = 16", "ffn_multiple_of = 16\nexperts_per_token = 2"), "experts_per_token"),
    (GOOD.replace("norm_eps = 1e-5", "norm_eps = -1.0"), "norm_eps"),
])
def test_malformed_preset_raises_preset_error_naming_the_key(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(PresetError) as exc:
        load_model(path)
    assert f"key '{key}'" in str(exc.value) and path in str(exc.value)
