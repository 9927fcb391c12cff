"""TorchTitan 0.3.0 training configs for Llama 2 (7B, 13B, 70B), which that release no longer ships.

TorchTitan trained Llama 2 with the same decoder its Llama 3 model still implements (RMSNorm, RoPE, GQA attention,
SwiGLU); only the shapes differ: vocabulary 32000, RoPE theta 10000 without Llama 3.1's frequency scaling, 4096-token
context, and Llama 2's FFN sizes. These functions build TorchTitan's own `llama3_8b`-style trainer config around a
`Llama3Model.Config` with the shapes of Phantora's model presets, so that
`python -m torchtitan.train --module phantora.frameworks.torchtitan.llama2 --config llama2_13b ...` trains
Llama 2 in TorchTitan 0.3.0 (TorchTitan imports this module by its path). Imported only inside a rank that has
TorchTitan.
"""

from __future__ import annotations

from phantora.models import load_model


def _model_spec(preset: str):
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.llama3 import (_EMBEDDING_INIT, _NORM_INIT, _build_llama3_layers, _output_linear_init,
                                          model_registry)
    from torchtitan.models.llama3.model import Llama3Model

    m = load_model(preset)
    spec = model_registry("8B")               # TorchTitan's Llama decoder, parallelisation and state-dict adapter
    spec.flavor = preset
    spec.model = Llama3Model.Config(
        dim=m.dim,
        vocab_size=m.vocab_size,
        tok_embeddings=Embedding.Config(num_embeddings=m.vocab_size, embedding_dim=m.dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=m.dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=m.dim, out_features=m.vocab_size, param_init=_output_linear_init(m.dim)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=m.n_layers, dim=m.dim, n_heads=m.n_heads, n_kv_heads=m.n_kv_heads,
            hidden_dim=m.ffn_dim,
            rope=ComplexRoPE.Config(dim=m.dim // m.n_heads, max_seq_len=m.max_seq_len, theta=m.rope_theta,
                                    scaling="none"),
            attn_backend="flex"),
    )
    return spec


def _config(preset: str, lr: float):
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.config import TrainingConfig
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.trainer import Trainer

    spec = _model_spec(preset)
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))),
        model_spec=spec,
        optimizer=default_adamw(lr=lr),
        training=TrainingConfig(local_batch_size=1, seq_len=4096, steps=1000),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4"),
        activation_checkpoint=SelectiveAC.Config(),
    )


def llama2_7b():
    return _config("llama2-7b", 3e-4)


def llama2_13b():
    return _config("llama2-13b", 3e-4)


def llama2_70b():
    return _config("llama2-70b", 1.5e-4)
