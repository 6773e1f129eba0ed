"""OLMo Hybrid's (``olmo_hybrid``) tensors on disk <-> as pivotflow holds them.

Its files keep each DeltaNet layer's input projections and convolutions apart
(``linear_attn.q_proj``/``k_proj``/``v_proj``, ``q_conv1d``/``k_conv1d``/``v_conv1d``) and
name the rest its own way (``a_proj``, ``b_proj``, ``g_proj``, ``o_proj``, ``o_norm``), and
its layers' norms OLMo-core's way (``attention_layer_norm``, ``feedforward_layer_norm``; as
transformers 5 renames them). pivotflow holds them as Qwen3.5 does (``in_proj_qkv`` and
``conv1d`` the three stacked: one copy as the folder is read; ``in_proj_a``, ``in_proj_b``,
``in_proj_z``, ``out_proj``, ``norm``) and the norms under every other family's names;
written back apart (views) for transformers and vLLM, each convolution at its projection's
width as OLMo-core's checkpoints and vLLM have it. (transformers 5.25's save_pretrained cuts
the stacked convolution into three equal parts, not at q's, k's and v's widths; its own load
stacks them again, and so does pivotflow's.)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# its names -> pivotflow's (the rest of a DeltaNet layer, and the norms)
_RENAMED = {"linear_attn.a_proj.weight": "linear_attn.in_proj_a.weight",
            "linear_attn.b_proj.weight": "linear_attn.in_proj_b.weight",
            "linear_attn.g_proj.weight": "linear_attn.in_proj_z.weight",
            "linear_attn.o_proj.weight": "linear_attn.out_proj.weight",
            "linear_attn.o_norm.weight": "linear_attn.norm.weight",
            "attention_layer_norm.weight": "input_layernorm.weight",
            "feedforward_layer_norm.weight": "post_attention_layernorm.weight"}
_BACK = {held: disk for disk, held in _RENAMED.items()}
# the parts stacked into one held tensor, in order: (held, its parts in the file)
_STACKED = (("linear_attn.in_proj_qkv.weight",
             ("linear_attn.q_proj.weight", "linear_attn.k_proj.weight",
              "linear_attn.v_proj.weight")),
            ("linear_attn.conv1d.weight",
             ("linear_attn.q_conv1d.weight", "linear_attn.k_conv1d.weight",
              "linear_attn.v_conv1d.weight")))
_LAYER = re.compile(r"(model\.layers\.\d+\.)(.*)")


def olmo_hybrid_split(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An OLMo Hybrid folder's tensors under pivotflow's names, a DeltaNet layer's q/k/v
    projections and convolutions stacked (transformers 5's own names read as they are)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        m = _LAYER.fullmatch(name)
        inner = "" if m is None else m.group(2)
        stacked = next((held for held, names in _STACKED if inner in names), None)
        if m is not None and stacked is not None:
            parts.setdefault(m.group(1) + stacked, {})[inner] = t
        elif m is not None and inner in _RENAMED:
            out[m.group(1) + _RENAMED[inner]] = t
        else:
            out[name] = t
    for name, got in parts.items():
        held = name.split(".", 3)[-1]
        names = dict(_STACKED)[held]
        out[name] = torch.cat([got[n] for n in names if n in got])
    return out


def olmo_hybrid_disk(cfg: ModelConfig,
                     tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held tensors under OLMo Hybrid's file names, the stacked ones apart again (views)."""
    key, value = (cfg.linear_num_key_heads * cfg.linear_key_head_dim,
                  cfg.linear_num_value_heads * cfg.linear_value_head_dim)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        m = _LAYER.fullmatch(name)
        inner = "" if m is None else m.group(2)
        stacked = dict(_STACKED).get(inner)
        if m is not None and stacked is not None:
            for part, chunk in zip(stacked, t.split([key, key, value]), strict=True):
                out[m.group(1) + part] = chunk
        elif m is not None and inner in _BACK:
            out[m.group(1) + _BACK[inner]] = t
        else:
            out[name] = t
    return out


# pivotflow's DeltaNet module names -> OLMo Hybrid's (LoRA targets; in_proj_qkv: three)
TARGETS = {"in_proj_qkv": ("q_proj", "k_proj", "v_proj"), "in_proj_a": ("a_proj",),
           "in_proj_b": ("b_proj",), "in_proj_z": ("g_proj",), "out_proj": ("o_proj",)}


def olmo_hybrid_adapters(cfg: ModelConfig,
                         adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LoRA adapters of pivotflow's DeltaNet modules as adapters of OLMo Hybrid's: a stacked
    q/k/v projection's as three of the same rank (each A the stacked one's, each B its rows:
    each part's update exactly), the others renamed."""
    key, value = (cfg.linear_num_key_heads * cfg.linear_key_head_dim,
                  cfg.linear_num_value_heads * cfg.linear_value_head_dim)
    out: dict[str, torch.Tensor] = {}
    for name, t in adapters.items():
        m = re.fullmatch(r"(.*\.linear_attn\.)(\w+)\.(lora_[AB])", name)
        if m is None or m.group(2) not in TARGETS:
            out[name] = t
            continue
        prefix, module, which = m.groups()
        parts = TARGETS[module]
        chunks = (t.split([key, key, value]) if which == "lora_B" and len(parts) == 3
                  else (t,) * len(parts))
        for part, chunk in zip(parts, chunks, strict=True):
            out[f"{prefix}{part}.{which}"] = chunk
    return out
