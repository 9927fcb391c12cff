"""Model presets: the shapes of decoder-only transformers, each with its source.

One TOML file per model in presets/models/. `load_model("llama3-8b")` returns a `ModelSpec`, which also counts the
model's parameters and the training FLOPs per token that TorchTitan's MFU uses (see `ModelSpec.flops_per_token`).

Every model here is a pre-norm decoder: token embedding, `n_layers` blocks of (RMSNorm, grouped-query attention with
RoPE, RMSNorm, SwiGLU MLP or a mixture of SwiGLU experts), a final RMSNorm and an output projection to the vocabulary;
except the `moe-stack` family (`MOE_STACK`): `n_layers` blocks of `x + MoE(RMSNorm(x))` and nothing else, no
embedding, attention, final norm or output (the MoE trainer presets/workloads/moe.py; its tokens do not interact, so
its presets have `max_seq_len = 1`, and `n_heads`, `n_kv_heads`, `vocab_size` and `rope_theta` are 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .errors import PhantoraError, PresetError
from .paths import presets_dir
from .tomlconf import build, check_number, read_toml

FAMILIES = ("llama2", "llama3", "mixtral", "qwen3-moe", "gpt-oss", "moe-stack")
MOE_STACK = "moe-stack"      # blocks of x + MoE(RMSNorm(x)) only: no embedding, attention, final norm or output

# Bytes per element of the dtypes a parameter can be stored in.
DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "float": 4, "tf32": 4,
    "bf16": 2, "bfloat16": 2,
    "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def llama_ffn_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU hidden size of a Llama block, as Meta's and TorchTitan's code derive it from `dim`.

    Two thirds of 4 × dim (truncated), times the optional multiplier (truncated), rounded up to a multiple of
    `multiple_of` (TorchTitan `compute_ffn_hidden_dim`, torchtitan/models/common/feed_forward.py).
    """
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class ModelSpec:
    name: str                      # preset id, e.g. "llama3-8b"
    family: str                    # one of FAMILIES
    dim: int                       # hidden size (model width)
    n_layers: int                  # transformer blocks
    n_heads: int                   # query heads
    n_kv_heads: int                # key/value heads (grouped-query attention; == n_heads for plain multi-head)
    vocab_size: int
    ffn_dim: int                   # SwiGLU hidden size of the MLP; in an MoE model, of each routed expert
    max_seq_len: int               # longest context the released model supports
    rope_theta: float              # RoPE base
    norm_eps: float                # RMSNorm epsilon
    num_experts: int = 0           # routed experts per MoE layer (0: dense model)
    experts_per_token: int = 0     # routed experts each token uses (top-k)
    moe_ffn_dim: int = 0           # SwiGLU hidden size of each routed (and shared) expert
    shared_experts: int = 0        # always-active experts per MoE layer, each of moe_ffn_dim
    head_dim: int = 0              # per-head size; 0 means dim // n_heads
    tie_embeddings: bool = False   # output projection shares the embedding table
    qk_norm: bool = False          # RMSNorm on each head's queries and keys (Qwen3): 2 × head_dim weights per layer
    attn_bias: bool = False        # q, k, v and output projections carry biases (gpt-oss)
    moe_bias: bool = False         # router and expert projections carry biases (gpt-oss)
    attn_sinks: bool = False       # one learned sink logit per query head and layer (gpt-oss)
    sliding_window: int = 0        # window of the banded-attention layers (gpt-oss: every other layer); 0 = none
    ffn_multiple_of: int = 0       # Llama recipe for ffn_dim (see llama_ffn_dim); 0 = ffn_dim given directly
    ffn_dim_multiplier: float = 0.0    # Llama recipe multiplier; 0 = none
    sources: dict[str, str] = field(default_factory=dict)   # field name (or "shape") -> citation
    notes: str = ""

    # ----------------------------------------------------------------------------------------------------------
    def validate(self) -> None:
        if self.family not in FAMILIES:
            raise PresetError(f"'{self.family}' is not one of {', '.join(FAMILIES)}", key="family")
        if self.is_moe_stack:
            self._validate_moe_stack()
        for key in ("dim", "n_layers", "ffn_dim", "max_seq_len",
                    *(() if self.is_moe_stack else ("n_heads", "n_kv_heads", "vocab_size"))):
            if getattr(self, key) <= 0:
                raise PresetError("must be positive", key=key)
        for key in ("norm_eps", *(() if self.is_moe_stack else ("rope_theta",))):
            check_number(getattr(self, key), key, positive=True)
        check_number(self.ffn_dim_multiplier, "ffn_dim_multiplier", nonnegative=True)
        for key in ("num_experts", "experts_per_token", "moe_ffn_dim", "shared_experts", "head_dim",
                    "sliding_window", "ffn_multiple_of", "ffn_dim_multiplier"):
            if getattr(self, key) < 0:
                raise PresetError("must not be negative", key=key)
        if self.n_kv_heads and self.n_heads % self.n_kv_heads:
            raise PresetError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})",
                              key="n_kv_heads")
        if self.n_heads and self.head_dim == 0 and self.dim % self.n_heads:
            raise PresetError(f"dim ({self.dim}) is not divisible by n_heads ({self.n_heads}); give head_dim",
                              key="head_dim")
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                raise PresetError(f"must be between 1 and num_experts ({self.num_experts})",
                                  key="experts_per_token")
            if self.moe_ffn_dim <= 0:
                raise PresetError("an MoE model needs the size of its experts", key="moe_ffn_dim")
            if self.ffn_dim != self.moe_ffn_dim:
                raise PresetError(f"every layer of an MoE preset is an MoE layer, so ffn_dim ({self.ffn_dim}) must "
                                  f"equal moe_ffn_dim ({self.moe_ffn_dim})", key="ffn_dim")
        else:
            for key in ("experts_per_token", "moe_ffn_dim", "shared_experts"):
                if getattr(self, key):
                    raise PresetError("only an MoE model (num_experts > 0) has this", key=key)
            if self.moe_bias:
                raise PresetError("only an MoE model (num_experts > 0) has this", key="moe_bias")
        if self.ffn_dim_multiplier and not self.ffn_multiple_of:
            raise PresetError("the Llama recipe needs ffn_multiple_of too", key="ffn_dim_multiplier")
        if self.ffn_multiple_of:
            expect = llama_ffn_dim(self.dim, self.ffn_multiple_of, self.ffn_dim_multiplier or None)
            if expect != self.ffn_dim:
                raise PresetError(f"ffn_dim {self.ffn_dim} disagrees with the recipe (dim {self.dim}, multiple_of "
                                  f"{self.ffn_multiple_of}, multiplier {self.ffn_dim_multiplier or None}), which "
                                  f"gives {expect}", key="ffn_dim")
        if "shape" not in self.sources:
            raise PresetError("the model's shape needs a source", key="sources.shape")

    def _validate_moe_stack(self) -> None:
        """A `moe-stack` preset: MoE layers only, so no attention, vocabulary or context, and no decoder options."""
        for key in ("n_heads", "n_kv_heads", "vocab_size", "head_dim", "sliding_window", "shared_experts"):
            if getattr(self, key):
                raise PresetError(f"a {MOE_STACK} model has no attention, vocabulary or shared experts: give 0",
                                  key=key)
        if self.rope_theta:
            raise PresetError(f"a {MOE_STACK} model has no attention (no RoPE): give 0", key="rope_theta")
        for key in ("tie_embeddings", "qk_norm", "attn_bias", "attn_sinks"):
            if getattr(self, key):
                raise PresetError(f"a {MOE_STACK} model has no embedding or attention", key=key)
        if self.max_seq_len != 1:
            raise PresetError(f"a {MOE_STACK} model's tokens do not interact: a sequence is one token (give 1)",
                              key="max_seq_len")
        if not self.num_experts:
            raise PresetError(f"a {MOE_STACK} model is made of MoE layers: give its experts", key="num_experts")

    # ------------------------------------------------------------------------------------------------- shapes
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_moe_stack(self) -> bool:
        """Blocks of x + MoE(RMSNorm(x)) only (the MoE trainer's model), no embedding, attention or output."""
        return self.family == MOE_STACK

    @property
    def head_size(self) -> int:
        """Per-head size: `head_dim`, or dim // n_heads where the preset leaves it 0 (0 without attention)."""
        if not self.n_heads:
            return 0
        return self.head_dim or self.dim // self.n_heads

    # --------------------------------------------------------------------------------------- parameter counts
    def embedding_params(self) -> int:
        """The input embedding table (vocab_size × dim)."""
        return self.vocab_size * self.dim

    def output_params(self) -> int:
        """The output projection to the vocabulary (0 when tied to the embedding)."""
        return 0 if self.tie_embeddings else self.vocab_size * self.dim

    def attention_params_per_layer(self) -> int:
        """q, k, v and output projections of one layer, with their biases, q/k norms and sinks (0 without attention)."""
        if not self.n_heads:
            return 0
        hd, q, kv = self.head_size, self.n_heads * self.head_size, self.n_kv_heads * self.head_size
        n = self.dim * q + 2 * self.dim * kv + q * self.dim
        if self.attn_bias:
            n += q + 2 * kv + self.dim
        if self.qk_norm:
            n += 2 * hd
        if self.attn_sinks:
            n += self.n_heads
        return n

    def expert_params(self) -> int:
        """One SwiGLU expert (gate, up and down projections, with biases where the model has them)."""
        n = 3 * self.dim * self.moe_ffn_dim
        if self.moe_bias:
            n += 2 * self.moe_ffn_dim + self.dim
        return n

    def router_params_per_layer(self) -> int:
        if not self.is_moe:
            return 0
        return self.dim * self.num_experts + (self.num_experts if self.moe_bias else 0)

    def mlp_params_per_layer(self, *, active: bool = False) -> int:
        """The MLP (or MoE block) of one layer; `active=True` counts only the experts one token runs through."""
        if not self.is_moe:
            return 3 * self.dim * self.ffn_dim
        routed = self.experts_per_token if active else self.num_experts
        return (self.router_params_per_layer() + routed * self.expert_params()
                + self.shared_experts * 3 * self.dim * self.moe_ffn_dim)

    def norm_params_per_layer(self) -> int:
        """The RMSNorm weights of one layer: before attention and before the MLP (one, before the MoE, in a
        moe-stack)."""
        return self.dim if self.is_moe_stack else 2 * self.dim

    def final_norm_params(self) -> int:
        return 0 if self.is_moe_stack else self.dim

    def params_per_layer(self, *, active: bool = False) -> int:
        return (self.attention_params_per_layer() + self.mlp_params_per_layer(active=active)
                + self.norm_params_per_layer())

    def num_params(self) -> int:
        """Every parameter of the model (a tied embedding counted once)."""
        return (self.embedding_params() + self.output_params() + self.final_norm_params()
                + self.n_layers * self.params_per_layer())

    def num_active_params(self) -> int:
        """Parameters one token uses: all of them for a dense model; without the unused routed experts for MoE.

        Both embedding tables are included (the convention behind Mixtral's "12.9B active" and Qwen3-30B-A3B's
        "3.3B activated"; gpt-oss's model card leaves the input embedding out: subtract `embedding_params()`).
        """
        return (self.embedding_params() + self.output_params() + self.final_norm_params()
                + self.n_layers * self.params_per_layer(active=True))

    def param_bytes(self, dtype: str = "bf16") -> int:
        """Bytes that all parameters take in `dtype` ('bf16', 'fp32', 'torch.float16', ...)."""
        key = str(dtype).removeprefix("torch.").lower()
        if key not in DTYPE_BYTES:
            raise PhantoraError(f"unknown dtype '{dtype}'; known: {', '.join(sorted(DTYPE_BYTES))}")
        return self.num_params() * DTYPE_BYTES[key]

    # ------------------------------------------------------------------------------------------------- FLOPs
    def attention_flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token of the two attention matmuls (scores and weighted values), forward+backward.

        TorchTitan: 6 × n_layers × n_heads × (qk_head_dim + v_head_dim) × seq_len, which for equal q/k/v head sizes
        is the older 12 × n_layers × n_heads × head_dim × seq_len; causal masking and sliding windows are not
        discounted and the flash-attention recomputation is not counted.
        """
        return 6 * self.n_layers * self.n_heads * (2 * self.head_size) * seq_len

    def flops_per_token(self, seq_len: int, *, count_embedding: bool = False) -> int:
        """Training FLOPs per token as TorchTitan's MFU counts them.

        6 × (active parameters less the input embedding table) + `attention_flops_per_token(seq_len)`: TorchTitan's
        `get_num_flop_per_token` (torchtitan/utils.py, 2024) and `get_dense_model_nparams_and_flops` /
        `get_moe_model_nparams_and_flops` (torchtitan/models/utils.py, 0.3.0), where routed experts count
        top_k / num_experts of their parameters. A tied embedding is not subtracted (it is also the output matmul).

        `count_embedding=True` gives the earlier definition, 6 × all (active) parameters, which TorchTitan used
        until pytorch/torchtitan#280 (2024-04-26) and with which its first A100 tables were computed.
        """
        if seq_len <= 0:
            raise PhantoraError(f"seq_len must be positive, got {seq_len}")
        params = self.num_active_params()
        if not count_embedding and not self.tie_embeddings:
            params -= self.embedding_params()
        return 6 * params + self.attention_flops_per_token(seq_len)


def model_dir() -> Path:
    return presets_dir() / "models"


def list_models() -> list[str]:
    return sorted(p.stem for p in model_dir().glob("*.toml"))


@lru_cache(maxsize=None)
def _load(path: str) -> ModelSpec:
    table = read_toml(Path(path))
    return build(ModelSpec, table, file=path)


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (`llama3-8b`) or by path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return _load(str(p.resolve()))
    path = model_dir() / f"{name_or_path}.toml"
    if not path.exists():
        known = ", ".join(list_models()) or "(none)"
        raise PresetError(f"unknown model preset '{name_or_path}'; known: {known}")
    return _load(str(path))
