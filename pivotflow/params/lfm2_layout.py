"""LFM2's (``lfm2``, ``lfm2_moe``) tensors on disk <-> as pivotflow holds them: renames only.

Its files name a layer's norms ``operator_norm`` and ``ffn_norm``, its attention's output
``out_proj`` and q/k norms ``q_layernorm``/``k_layernorm``, its MLP ``feed_forward.w1``
(gate), ``w3`` (up) and ``w2`` (down), and the final norm ``embedding_norm``; pivotflow holds
them under every other family's names (a convolution layer's ``conv.*`` as they are).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_LAYER_NAMES = {"operator_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "self_attn.out_proj": "self_attn.o_proj", "self_attn.q_layernorm": "self_attn.q_norm",
                "self_attn.k_layernorm": "self_attn.k_norm", "feed_forward.w1": "mlp.gate_proj",
                "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj"}
_BACK = {held: disk for disk, held in _LAYER_NAMES.items()}
_LAYER = re.compile(r"(model\.layers\.\d+\.)(\w+\.?\w*)\.(weight|bias|lora_A|lora_B)")
_NORM = ("model.embedding_norm.weight", "model.norm.weight")
# LoRA targets: pivotflow's module names -> LFM2's
TARGETS = {"o_proj": "out_proj", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# LFM2-MoE's sparse blocks: its router, its correction bias (on the block there, on the router
# here, as GLM-4.5's) and its experts' w1/w3/w2
_MOE_DISK = re.compile(r"(model\.layers\.\d+\.)feed_forward\.(gate\.weight|expert_bias|"
                       r"experts\.\d+\.w[123]\.(?:weight|lora_A|lora_B))")
_MOE_HELD = re.compile(r"(model\.layers\.\d+\.)mlp\.(gate\.weight|gate\.e_score_correction_bias|"
                       r"experts\.\d+\.(?:gate|up|down)_proj\.(?:weight|lora_A|lora_B))")
_W = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_W_BACK = {v: k for k, v in _W.items()}


def _moe_name(prefix: str, inner: str, to_disk: bool) -> str:
    """A sparse block's tensor ``inner`` (after ``feed_forward.`` or ``mlp.``) renamed."""
    if inner in ("expert_bias", "gate.e_score_correction_bias"):
        return f"{prefix}{'feed_forward.expert_bias' if to_disk else 'mlp.gate.e_score_correction_bias'}"
    parts = inner.split(".")
    if parts[0] == "experts":
        parts[2] = (_W_BACK if to_disk else _W)[parts[2]]
    return f"{prefix}{'feed_forward' if to_disk else 'mlp'}.{'.'.join(parts)}"


def lfm2_names(tensors: dict[str, torch.Tensor], to_disk: bool) -> dict[str, torch.Tensor]:
    """``tensors`` (weights, or LoRA adapters) under LFM2's file names (``to_disk``) or
    pivotflow's."""
    names = _BACK if to_disk else _LAYER_NAMES
    norm_from, norm_to = _NORM[::-1] if to_disk else _NORM
    out: dict[str, torch.Tensor] = {}
    moe = _MOE_HELD if to_disk else _MOE_DISK
    for name, t in tensors.items():
        if (e := moe.fullmatch(name)) is not None:
            out[_moe_name(e.group(1), e.group(2), to_disk)] = t
            continue
        m = _LAYER.fullmatch(name)
        if m is not None and m.group(2) in names:
            name = f"{m.group(1)}{names[m.group(2)]}.{m.group(3)}"
        out[norm_to if name == norm_from else name] = t
    return out
