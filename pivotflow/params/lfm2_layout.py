"""LFM2's (``lfm2``) tensors on disk <-> as pivotflow holds them: renames only.

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


def lfm2_names(tensors: dict[str, torch.Tensor], to_disk: bool) -> dict[str, torch.Tensor]:
    """``tensors`` (weights, or LoRA adapters) under LFM2's file names (``to_disk``) or
    pivotflow's."""
    names = _BACK if to_disk else _LAYER_NAMES
    norm_from, norm_to = _NORM[::-1] if to_disk else _NORM
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        m = _LAYER.fullmatch(name)
        if m is not None and m.group(2) in names:
            name = f"{m.group(1)}{names[m.group(2)]}.{m.group(3)}"
        out[norm_to if name == norm_from else name] = t
    return out
