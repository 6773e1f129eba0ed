"""How a model family lays its tensors out on disk, and how pivotflow holds them.

pivotflow holds every decoder in one layout: ``self_attn.q_proj``/``k_proj``/``v_proj``,
``mlp.gate_proj``/``up_proj``/``down_proj``, and a sparse layer's ``mlp.gate`` router and
``mlp.experts.E.*_proj`` experts: the names its trainer's ``Decoder``, the store and LoRA use.
Three families store theirs otherwise:

* Phi-3 and Phi-4 (``model_type`` phi3) fuse projections: ``self_attn.qkv_proj`` (q, k and v
  stacked by rows) and ``mlp.gate_up_proj`` (gate, then up). vLLM's and SGLang's loaders stack
  split projections themselves, so an engine may be sent either.
* Mixtral names its sparse layer ``block_sparse_moe`` and its experts' projections ``w1``
  (gate), ``w3`` (up) and ``w2`` (down), which is all vLLM's and SGLang's loaders read.
* GLM-4 fuses gate/up, names its four norms its own way, and rotates interleaved pairs of
  each head's dimensions, which pivotflow holds reordered (``_turn_heads``).

``held_layout`` turns a folder's tensors into pivotflow's as it is read; ``disk_layout`` turns
them back as one is written, so every folder pivotflow writes loads in transformers and vLLM as
the family's own class; ``engine_names`` gives an engine that loads by checkpoint names the
family's names without fusing anything (no copy); ``fused_adapters`` turns LoRA adapters of
split projections into PEFT adapters of the fused ones.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

_QKV, _GATE_UP = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"
_SPLIT_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_SPLIT_GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
_FAMILIES = {"Phi3ForCausalLM": "phi3", "Phi3ForSequenceClassification": "phi3",
             "MixtralForCausalLM": "mixtral", "MixtralForSequenceClassification": "mixtral",
             "Glm4ForCausalLM": "glm4", "Glm4ForSequenceClassification": "glm4"}
# Mixtral's names <-> pivotflow's (a layer's router; an expert's three projections)
_MIXTRAL_DISK = re.compile(r"(.*\.)block_sparse_moe\.(gate|experts\.\d+\.w([123]))\.weight")
_MIXTRAL_HELD = re.compile(r"(.*\.)mlp\.(gate|experts\.\d+\.(gate|down|up)_proj)\.weight")
_W_TO_PROJ = {"1": "gate", "2": "down", "3": "up"}
_PROJ_TO_W = {v: k for k, v in _W_TO_PROJ.items()}


def _module(tensor: str) -> str:
    """A weight's module name (``self_attn.qkv_proj.weight`` -> ``self_attn.qkv_proj``)."""
    return tensor.removesuffix(".weight")


def family_of(config: dict[str, Any]) -> str | None:
    """The family whose on-disk layout differs from pivotflow's (phi3, mixtral, glm4), or
    None."""
    kind = config.get("model_type")
    if kind is None:  # very old exports name only the class
        kind = next((_FAMILIES[a] for a in config.get("architectures") or [] if a in _FAMILIES),
                    None)
    return kind if kind in ("phi3", "mixtral", "glm4") else None


def _mixtral_name(name: str, to_disk: bool) -> str:
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


def _head_rows(config: dict[str, Any], where: str) -> tuple[int, int]:
    """(rows of q, rows of k, which v has too) of a fused qkv_proj."""
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelConfigError(f"{where}: cannot split qkv_proj: config.json has no usable "
                               f"head counts ({exc!r})") from None
    return heads * head_dim, kv_heads * head_dim


def held_layout(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], where: str
) -> dict[str, torch.Tensor]:
    """``tensors`` as pivotflow holds them: fused projections split into views (phi3, glm4),
    Mixtral's and GLM-4's names renamed, GLM-4's q/k rows reordered (``_turn_heads``), every
    other tensor as it is. Raises ModelConfigError naming ``where`` and the tensor whose rows
    do not split as the config says."""
    family = family_of(config)
    if family == "mixtral":
        return {_mixtral_name(name, to_disk=False): t for name, t in tensors.items()}
    if family == "glm4":
        held = _renamed_norms(_split(config, tensors, where, qkv=False), _GLM_NORMS)
        return _turn_heads(config, held, where, to_disk=False)
    if family != "phi3":
        return tensors
    return _split(config, tensors, where, qkv=True)


def _split(config: dict[str, Any], tensors: dict[str, torch.Tensor], where: str,
           qkv: bool) -> dict[str, torch.Tensor]:
    """Fused gate_up_proj (and qkv_proj when ``qkv``) split by rows into views."""
    q_rows, kv_rows = _head_rows(config, where) if qkv else (0, 0)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        rows: tuple[int, ...]
        parts: tuple[str, ...]
        prefix = name[: -len(_QKV)] if qkv and name.endswith(_QKV) else None
        if prefix is not None:
            rows = (q_rows, kv_rows, kv_rows)
            parts = _SPLIT_QKV
        elif name.endswith(_GATE_UP):
            prefix, parts = name[: -len(_GATE_UP)], _SPLIT_GATE_UP
            rows = (t.shape[0] // 2, t.shape[0] // 2) if t.dim() == 2 else (0, 0)
        else:
            out[name] = t
            continue
        if t.dim() != 2 or t.shape[0] != sum(rows) or not all(rows):
            raise ModelConfigError(
                f"{where}: tensor {name!r} has shape {tuple(t.shape)}, which does not split "
                f"into {' + '.join(map(str, rows))} rows ({', '.join(p.split('.')[1] for p in parts)})"
            )
        for part, chunk in zip(parts, t.split(list(rows)), strict=True):
            out[prefix + part] = chunk
    return out


def engine_names(config: dict[str, Any],
                 tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` as an engine's checkpoint loader reads them (Mixtral's and GLM-4's names,
    GLM-4's q/k rows in its own order), nothing fused: vLLM and SGLang stack split projections
    themselves."""
    family = family_of(config)
    if family == "mixtral":
        return {_mixtral_name(name, to_disk=True): t for name, t in tensors.items()}
    if family == "glm4":
        turned = _turn_heads(config, tensors, "engine export", to_disk=True)
        return _renamed_norms(turned, {v: k for k, v in _GLM_NORMS.items()})
    return tensors


def disk_layout(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` as the family stores them: Mixtral's and GLM-4's names and order, split
    projections fused again (phi3, glm4; a layer holding only some of the parts keeps them
    split), every other tensor as it is."""
    family = family_of(config)
    if family not in ("phi3", "mixtral", "glm4"):
        return tensors
    tensors = engine_names(config, tensors)
    if family == "mixtral":
        return tensors
    import torch

    fusions = ((_SPLIT_QKV, _QKV), (_SPLIT_GATE_UP, _GATE_UP))
    out = dict(tensors)
    for name in tensors:
        for parts, fused in fusions[family == "glm4":]:  # (GLM-4 keeps q, k and v apart)
            if not name.endswith(parts[0]):
                continue
            prefix = name[: -len(parts[0])]
            names = [prefix + p for p in parts]
            if all(n in out for n in names):
                out[prefix + fused] = torch.cat([out.pop(n) for n in names])
    return out


# GLM-4's norms by pivotflow's names (its second norm is the MLP's input norm, and it has one
# after each sub-layer as Gemma has)
_GLM_NORMS = {"post_self_attn_layernorm": "post_attention_layernorm",
              "post_attention_layernorm": "pre_feedforward_layernorm",
              "post_mlp_layernorm": "post_feedforward_layernorm"}
_NORM = re.compile(r"(.*\.)(\w+_layernorm)\.weight")


def _renamed_norms(tensors: dict[str, torch.Tensor],
                   names: dict[str, str]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        m = _NORM.fullmatch(name)
        out[f"{m.group(1)}{names[m.group(2)]}.weight"
            if m is not None and m.group(2) in names else name] = t
    return out


def _turn_heads(config: dict[str, Any], tensors: dict[str, torch.Tensor], where: str,
                to_disk: bool) -> dict[str, torch.Tensor]:
    """GLM-4 rotates interleaved pairs (dimensions 2i, 2i+1 of a head's rotary part) where
    pivotflow's rope rotates halves (i, i + r/2): each head's q and k rows (weights, biases)
    reorder the rotary part evens first, odds after, and back (``to_disk``). q.k is the same
    sum either way, so the model computes what transformers' does."""
    import torch

    head_dim = int(config.get("head_dim") or 128)  # (Glm4Config's default)
    partial = (config.get("rope_parameters") or {}).get(
        "partial_rotary_factor", config.get("partial_rotary_factor", 0.5))
    r = int(head_dim * partial)
    order = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, head_dim)))
    if to_disk:
        order = torch.argsort(order)
    out = dict(tensors)
    for name, t in tensors.items():
        if not name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias",
                              "self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            continue
        if t.shape[0] % head_dim:
            raise ModelConfigError(f"{where}: tensor {name!r} has {t.shape[0]} rows, not heads "
                                   f"of head_dim {head_dim}")
        by_head = t.reshape(t.shape[0] // head_dim, head_dim, *t.shape[1:])
        out[name] = by_head.index_select(1, order.to(t.device)).reshape(t.shape)
    return out


def fused_adapters(config: dict[str, Any], adapters: dict[str, torch.Tensor], rank: int,
                   alpha: float) -> tuple[dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """LoRA adapters of split projections (``<layer>.lora_A`` [r, in], ``.lora_B`` [out, r])
    as adapters of the file's fused ones (phi3; glm4's gate/up, its q/k rows put back in its
    order), with PEFT's ``rank_pattern`` and
    ``alpha_pattern`` for them; others as they are. n adapted parts of a fused projection make
    one adapter of rank n r: A the parts' A stacked, B block-diagonal over the parts' rows
    (zero rows for a part not adapted), alpha n alpha, so its update is the parts' updates
    exactly, scale alpha / r included."""
    family = family_of(config)
    if family not in ("phi3", "glm4"):
        return adapters, {}, {}
    import torch

    q_rows, kv_rows = _head_rows(config, "adapter export")
    inter = int(config["intermediate_size"])
    fusions = ((_QKV, _SPLIT_QKV, (q_rows, kv_rows, kv_rows)),
               (_GATE_UP, _SPLIT_GATE_UP, (inter, inter)))[family == "glm4":]
    out = dict(adapters)
    if family == "glm4":  # its q/k rows in its own order: B's rows are those rows
        bs = {k.removesuffix(".lora_B") + ".weight": t for k, t in adapters.items()
              if k.endswith((".q_proj.lora_B", ".k_proj.lora_B"))}
        out.update({k.removesuffix(".weight") + ".lora_B": t for k, t in
                    _turn_heads(config, bs, "adapter export", to_disk=True).items()})
    ranks: dict[str, int] = {}
    for fused, parts, rows in fusions:
        modules = [_module(p) for p in parts]
        layers = {k.removesuffix(f"{m}.lora_A") for k in adapters for m in modules
                  if k.endswith(f"{m}.lora_A")}
        for prefix in sorted(layers):
            names = [prefix + m for m in modules]
            present = [i for i, n in enumerate(names) if f"{n}.lora_A" in adapters]
            a = torch.cat([out.pop(f"{names[i]}.lora_A") for i in present])
            b = a.new_zeros(sum(rows), len(present) * rank)
            for j, i in enumerate(present):
                start = sum(rows[:i])
                b[start:start + rows[i], j * rank:(j + 1) * rank] = out.pop(f"{names[i]}.lora_B")
            out[f"{prefix}{_module(fused)}.lora_A"], out[f"{prefix}{_module(fused)}.lora_B"] = a, b
            key = _module(fused).split(".")[-1]  # (PEFT matches a pattern on the name's end)
            if ranks.setdefault(key, len(present) * rank) != len(present) * rank:
                raise ValueError(f"{key}: layers adapt different parts; PEFT's rank_pattern "
                                 "cannot say it")
    return out, ranks, {k: alpha * r / rank for k, r in ranks.items()}


def fused_targets(config: dict[str, Any], targets: list[str]) -> list[str]:
    """LoRA's target module names as the family's file names them: a split projection's as
    its fused one's (phi3), in order, once each; others as they are."""
    family = family_of(config)
    if family not in ("phi3", "glm4"):
        return list(targets)
    fusions = ((_QKV, _SPLIT_QKV), (_GATE_UP, _SPLIT_GATE_UP))[family == "glm4":]
    fused = {_module(p).split(".")[-1]: _module(f).split(".")[-1]
             for f, parts in fusions for p in parts}
    return list(dict.fromkeys(fused.get(t, t) for t in targets))
