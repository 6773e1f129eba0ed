"""How a model family lays its tensors out on disk, and how pivotflow holds them.

pivotflow holds every decoder in one layout: ``self_attn.q_proj``/``k_proj``/``v_proj`` and
``mlp.gate_proj``/``up_proj``, the names its trainer's ``Decoder``, the store, LoRA and vLLM's
loaders (whose stacked-parameter maps take either form) all use. Phi-3 and Phi-4
(``model_type`` phi3) ship those projections fused: ``self_attn.qkv_proj`` (q, k and v stacked
by rows) and ``mlp.gate_up_proj`` (gate, then up). They are split as a folder is read
(``held_layout``) and fused again as one is written (``disk_layout``), so every folder pivotflow
writes loads in transformers and vLLM as the family's own class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotflow.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

_QKV, _GATE_UP = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"
_SPLIT_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_SPLIT_GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
FUSED_CLASSES = ("Phi3ForCausalLM", "Phi3ForSequenceClassification")


def fuses_projections(config: dict[str, Any]) -> bool:
    """Whether ``config.json`` describes a family that stores fused projections (phi3)."""
    if "model_type" in config:
        return config["model_type"] == "phi3"
    return any(a in FUSED_CLASSES for a in config.get("architectures") or [])


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
    """``tensors`` as pivotflow holds them: fused projections split into views (phi3), every
    other tensor as it is. Raises ModelConfigError naming ``where`` and the tensor whose rows
    do not split as the config says."""
    if not fuses_projections(config):
        return tensors
    q_rows, kv_rows = _head_rows(config, where)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        rows: tuple[int, ...]
        parts: tuple[str, ...]
        prefix = name[: -len(_QKV)] if name.endswith(_QKV) else None
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


def disk_layout(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` as the family stores them: split projections fused again (phi3; a layer
    holding only some of the parts keeps them split), every other tensor as it is."""
    if not fuses_projections(config):
        return tensors
    import torch

    out = dict(tensors)
    for name in tensors:
        for first, parts, fused in ((_SPLIT_QKV[0], _SPLIT_QKV, _QKV),
                                    (_SPLIT_GATE_UP[0], _SPLIT_GATE_UP, _GATE_UP)):
            if not name.endswith(first):
                continue
            prefix = name[: -len(first)]
            names = [prefix + p for p in parts]
            if all(n in out for n in names):
                out[prefix + fused] = torch.cat([out.pop(n) for n in names])
    return out
