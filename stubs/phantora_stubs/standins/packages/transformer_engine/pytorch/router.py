"""transformer_engine.pytorch.router: TE's fused MoE router kernels (TE 2.7+). Not modelled."""

from .module.base import NotModelled


def _not_modelled(name):
    def fn(*args, **kwargs):
        raise NotModelled(f"transformer_engine.pytorch.router.{name} (the fused MoE router) is not modelled; "
                          f"turn the router fusion off (Megatron-core: moe_router_fusion=False)")
    fn.__name__ = name
    return fn


fused_topk_with_score_function = _not_modelled("fused_topk_with_score_function")
fused_compute_score_for_moe_aux_loss = _not_modelled("fused_compute_score_for_moe_aux_loss")
fused_moe_aux_loss = _not_modelled("fused_moe_aux_loss")
