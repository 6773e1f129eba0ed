"""AFMoE's (Arcee Trinity's) files as pivotflow holds them, and back.

Its attention's output gate is a projection of its own (``self_attn.gate_proj``), held inside
``q_proj`` as Qwen3.5's is: each head's query rows, then its gate rows, so the trainer and the
engine run one gated attention. Its router is ``mlp.router.gate``, held as ``mlp.gate``; the
correction bias on its sparse block (``mlp.expert_bias``) as the router's
(``mlp.gate.e_score_correction_bias``); its MLP norms (``pre_mlp_layernorm``,
``post_mlp_layernorm``) as Gemma's sandwich names (``pre_feedforward_layernorm``,
``post_feedforward_layernorm``). Its experts are one tensor each in the file, as held.
LoRA adapters of the held q_proj export as adapters of the file's q_proj and gate_proj (the
same A, each its rows of B: each part's update exactly).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.errors import ModelConfigError
from pivotflow.params.renamed_layout import ROUTER_ON_BLOCK, block_router_name

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# (the file's name -> pivotflow's, on a module's path)
_NAMES = {**ROUTER_ON_BLOCK, ".pre_mlp_layernorm.": ".pre_feedforward_layernorm.",
          ".post_mlp_layernorm.": ".post_feedforward_layernorm."}
_GATE = re.compile(r"(.*\.self_attn\.)gate_proj\.weight")
_Q = re.compile(r"(.*\.self_attn\.)q_proj\.(weight|lora_B)")
# LoRA's target names, pivotflow's -> the file's (the gate by its path: PEFT reads a bare
# "gate_proj" as the MLP's too, which transformers holds fused with up_proj in its experts)
TARGETS = {"q_proj": ("q_proj", "self_attn.gate_proj")}


def afmoe_held(cfg: ModelConfig, tensors: dict[str, torch.Tensor],
               where: str) -> dict[str, torch.Tensor]:
    """``tensors`` as pivotflow holds them: renamed, each layer's gate_proj inside its q_proj
    (by head: query rows, then gate rows). Raises ModelConfigError naming ``where`` and the
    tensor for a q or gate projection of another shape, or one without the other."""
    import torch

    out = {block_router_name(name, _NAMES, to_disk=False): t for name, t in tensors.items()
           if _GATE.fullmatch(name) is None}
    heads, d = cfg.num_attention_heads, cfg.head_dim
    for name, gate in tensors.items():
        if (m := _GATE.fullmatch(name)) is None:
            continue
        q = out.get(f"{m.group(1)}q_proj.weight")
        shape = (heads * d, cfg.hidden_size)
        for part, t in (("q_proj", q), ("gate_proj", gate)):
            if t is None or tuple(t.shape) != shape:
                raise ModelConfigError(
                    f"{where}: tensor {m.group(1)}{part}.weight is "
                    f"{'missing' if t is None else list(t.shape)}, not {list(shape)} (afmoe's "
                    "query and its gate, one each)")
        assert q is not None
        out[f"{m.group(1)}q_proj.weight"] = torch.stack(
            (q.view(heads, d, -1), gate.view(heads, d, -1)), 1).reshape(2 * heads * d, -1)
    return out


def afmoe_disk(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``afmoe_held`` undone (weights), or LoRA adapters of the held modules as adapters of the
    file's (each q_proj adapter's B split into q's rows and gate's, its A for both)."""
    out: dict[str, torch.Tensor] = {}
    heads, d = cfg.num_attention_heads, cfg.head_dim
    for name, t in tensors.items():
        renamed = block_router_name(name, _NAMES, to_disk=True)
        m = _Q.fullmatch(name)
        if m is None:
            q_a = re.fullmatch(r"(.*\.self_attn\.)q_proj\.lora_A", name)
            out[renamed] = t
            if q_a is not None:
                out[f"{q_a.group(1)}gate_proj.lora_A"] = t
            continue
        both = t.view(heads, 2, d, -1)
        out[f"{m.group(1)}q_proj.{m.group(2)}"] = both[:, 0].reshape(heads * d, -1).contiguous()
        out[f"{m.group(1)}gate_proj.{m.group(2)}"] = both[:, 1].reshape(heads * d, -1).contiguous()
    return out
