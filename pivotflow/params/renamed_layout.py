"""The families whose files only rename tensors, or reorder rows, where pivotflow holds them
otherwise (``hf_layout`` lays each family out): Mixtral's and MiniMax-M2's sparse layers
(``block_sparse_moe``, ``w1``/``w2``/``w3``; MiniMax-M2's router bias on the block), GLM-4's
norms, and GLM-4's and ERNIE 4.5's interleaved rotary pairs (``turn_heads``: q and k rows
reordered per head, LoRA B rows with them).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

# Mixtral's names <-> pivotflow's (a layer's router; an expert's three projections)
_MIXTRAL_DISK = re.compile(r"(.*\.)block_sparse_moe\.(gate|experts\.\d+\.w([123]))\.weight")
_MIXTRAL_HELD = re.compile(r"(.*\.)mlp\.(gate|experts\.\d+\.(gate|down|up)_proj)\.weight")
_W_TO_PROJ = {"1": "gate", "2": "down", "3": "up"}
_PROJ_TO_W = {v: k for k, v in _W_TO_PROJ.items()}


def mixtral_name(name: str, to_disk: bool) -> str:
    """A Mixtral tensor's name in the file (``to_disk``) or as pivotflow holds it; any other
    tensor's as it is."""
    m = (_MIXTRAL_HELD if to_disk else _MIXTRAL_DISK).fullmatch(name)
    if m is None:
        return name
    inner = m.group(2)  # the router ("gate"), or "experts.E." and a projection
    if inner != "gate":
        expert, proj = inner.rsplit(".", 1)[0], m.group(3)
        inner = f"{expert}.w{_PROJ_TO_W[proj]}" if to_disk else f"{expert}.{_W_TO_PROJ[proj]}_proj"
    return f"{m.group(1)}{'block_sparse_moe' if to_disk else 'mlp'}.{inner}.weight"


_MINIMAX_BIAS = ("block_sparse_moe.e_score_correction_bias", "mlp.gate.e_score_correction_bias")


def minimax_name(name: str, to_disk: bool) -> str:
    """A MiniMax-M2 tensor's name in the file (``to_disk``) or as pivotflow holds it: Mixtral's
    names, and its router's correction bias on the sparse block there, on the router here."""
    disk, held = _MINIMAX_BIAS
    src, dst = (held, disk) if to_disk else (disk, held)
    if name.endswith(src):
        return name[: -len(src)] + dst
    return mixtral_name(name, to_disk)


# GLM-4's norms by pivotflow's names (its second norm is the MLP's input norm, and it has one
# after each sub-layer as Gemma has)
GLM_NORMS = {"post_self_attn_layernorm": "post_attention_layernorm",
              "post_attention_layernorm": "pre_feedforward_layernorm",
              "post_mlp_layernorm": "post_feedforward_layernorm"}
GLM_NORMS_BACK = {held: disk for disk, held in GLM_NORMS.items()}
# Apertus's norms
APERTUS_NORMS = {"attention_layernorm": "input_layernorm",
                 "feedforward_layernorm": "post_attention_layernorm"}
APERTUS_NORMS_BACK = {held: disk for disk, held in APERTUS_NORMS.items()}
_NORM = re.compile(r"(.*\.)(\w+_layernorm)\.weight")


def renamed_norms(tensors: dict[str, torch.Tensor],
                   names: dict[str, str]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        m = _NORM.fullmatch(name)
        out[f"{m.group(1)}{names[m.group(2)]}.weight"
            if m is not None and m.group(2) in names else name] = t
    return out


# Hunyuan's modules by pivotflow's names: its q/k norms (which run after rope: ModelConfig's
# qk_norm_after_rope), Hunyuan-MoE's router and shared MLP
HUNYUAN_NAMES = {"self_attn.query_layernorm": "self_attn.q_norm",
                 "self_attn.key_layernorm": "self_attn.k_norm", "mlp.gate.wg": "mlp.gate",
                 "mlp.shared_mlp": "mlp.shared_experts"}
HUNYUAN_NAMES_BACK = {held: disk for disk, held in HUNYUAN_NAMES.items()}


# the router's name and its correction bias on the sparse block where AFMoE's and HY V3's files
# keep them (``mlp.router.gate``, ``mlp.expert_bias``), and pivotflow's
ROUTER_ON_BLOCK = {".mlp.router.gate.": ".mlp.gate."}
BLOCK_BIAS = (".mlp.expert_bias", ".mlp.gate.e_score_correction_bias")


# HY V3's (its shared MLP's too)
HY_V3_NAMES = {**ROUTER_ON_BLOCK, ".mlp.shared_mlp.": ".mlp.shared_experts."}


def block_router_name(name: str, names: dict[str, str], to_disk: bool) -> str:
    """A tensor's (or LoRA adapter's) name in the file (``to_disk``) or as pivotflow holds it,
    for a family whose correction bias is on its sparse block (``BLOCK_BIAS``) and whose
    modules ``names`` renames (the file's path part -> pivotflow's, dots around both)."""
    src, dst = (BLOCK_BIAS[1], BLOCK_BIAS[0]) if to_disk else BLOCK_BIAS
    if name.endswith(src):  # (before the router's name: the held bias is under it)
        return name[: -len(src)] + dst
    for disk, held in names.items():
        src, dst = (held, disk) if to_disk else (disk, held)
        if src in name:
            return name.replace(src, dst, 1)
    return name


def renamed_modules(tensors: dict[str, torch.Tensor],
                    names: dict[str, str]) -> dict[str, torch.Tensor]:
    """``tensors`` (weights, or LoRA adapters) with a module of ``names``' keys in their
    name renamed to its value (``.mlp.gate.wg.`` -> ``.mlp.gate.``)."""
    out = {}
    for name, t in tensors.items():
        module = next((m for m in names if f".{m}." in name), None)
        out[name if module is None else name.replace(f".{module}.", f".{names[module]}.", 1)] = t
    return out


_ERNIE_STATICS = ("mlp.moe_statics.e_score_correction_bias", "mlp.gate.e_score_correction_bias")


def ernie_statics(tensors: dict[str, torch.Tensor], to_disk: bool) -> dict[str, torch.Tensor]:
    """ERNIE 4.5 MoE's router correction bias as its file keeps it (``to_disk``:
    ``moe_statics``, [1, E]) or as pivotflow holds it (on the router, [E]); the rest as is."""
    disk, held = _ERNIE_STATICS
    src, dst = (held, disk) if to_disk else (disk, held)
    out = {}
    for name, t in tensors.items():
        if name.endswith(src):
            name, t = name[: -len(src)] + dst, t.reshape(1, -1) if to_disk else t.reshape(-1)
        out[name] = t
    return out


def turn_heads(cfg: ModelConfig, tensors: dict[str, torch.Tensor], where: str,
                to_disk: bool) -> dict[str, torch.Tensor]:
    """GLM-4 rotates interleaved pairs (dimensions 2i, 2i+1 of a head's rotary part) where
    pivotflow's rope rotates halves (i, i + r/2): each head's q and k rows (weights, biases)
    reorder the rotary part evens first, odds after, and back (``to_disk``). q.k is the same
    sum either way, so the model computes what transformers' does."""
    out = dict(tensors)
    for name, t in tensors.items():
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias",
                          "self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            out[name] = turned_rows(cfg, t, name, where, to_disk)
        elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            # (Command R+'s per-head norm weights [heads, head_dim]: each dimension's weight
            # goes where its dimension does)
            out[name] = turned_rows(cfg, t.reshape(-1, 1), name, where, to_disk).reshape(t.shape)
    return out


def turned_rows(cfg: ModelConfig, t: torch.Tensor, name: str, where: str,
                 to_disk: bool) -> torch.Tensor:
    """``t``'s rows (heads of head_dim) with each head's rotary part reordered
    (``turn_heads``)."""
    import torch

    d, r = cfg.head_dim, cfg.rotary_dim
    if t.shape[0] % d:
        raise ModelConfigError(f"{where}: tensor {name!r} has {t.shape[0]} rows, not heads "
                               f"of head_dim {d}")
    order = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, d)))
    if to_disk:
        order = torch.argsort(order)
    by_head = t.reshape(t.shape[0] // d, d, *t.shape[1:])
    return by_head.index_select(1, order.to(t.device)).reshape(t.shape)


def turned_adapters(cfg: ModelConfig, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LoRA adapters with q's and k's B rows in the family's own rotary order (GLM-4's and
    ERNIE 4.5's interleaved pairs: ``turn_heads``): B's rows are those rows."""
    return {k: turned_rows(cfg, t, k, "adapter export", to_disk=True)
            if k.endswith((".q_proj.lora_B", ".k_proj.lora_B")) else t
            for k, t in adapters.items()}
