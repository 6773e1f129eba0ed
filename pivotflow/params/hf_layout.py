"""How a model family lays its tensors out on disk, and how pivotflow holds them.

pivotflow holds every decoder in one layout: ``self_attn.q_proj``/``k_proj``/``v_proj``,
``mlp.gate_proj``/``up_proj``/``down_proj``, and a sparse layer's ``mlp.gate`` router and
``mlp.experts.E.*_proj`` experts: the names its trainer's ``Decoder``, the store and LoRA use.
These families store theirs otherwise:

* Phi-3 and Phi-4 (``model_type`` phi3) fuse projections: ``self_attn.qkv_proj`` (q, k and v
  stacked by rows) and ``mlp.gate_up_proj`` (gate, then up). vLLM's and SGLang's loaders stack
  split projections themselves, so an engine may be sent either.
* Qwen3-Next (``qwen3_next``) fuses its DeltaNet layers' input projections into
  ``linear_attn.in_proj_qkvz`` and ``in_proj_ba``, their rows grouped by key head (each
  group's q, k, then its value heads' v and z rows; b, then a rows: ``_grouped_order``).
  pivotflow holds them as Qwen3.5 names them (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``) and sends vLLM the file's fused, grouped rows. Its multi-token-prediction
  layer (``mtp.*``), as Qwen3.5's, is left out as the folder is read.
* Mixtral names its sparse layer ``block_sparse_moe`` and its experts' projections ``w1``
  (gate), ``w3`` (up) and ``w2`` (down), which is all vLLM's and SGLang's loaders read.
  MiniMax-M2 (``minimax_m2``) names them so too, its router's correction bias on the block
  (``block_sparse_moe.e_score_correction_bias``, held on the router as GLM-4.5's), and keeps
  its multi-token-prediction modules past the decoder's last layer (left out).
* GLM-4 fuses gate/up, names its four norms its own way, and rotates interleaved pairs of
  each head's dimensions, which pivotflow holds reordered (``turn_heads``); ERNIE 4.5
  (``ernie4_5``, ``ernie4_5_moe``) rotates interleaved pairs too, held so; ERNIE 4.5 MoE
  keeps its router's correction bias as ``mlp.moe_statics.e_score_correction_bias`` [1, E]
  (held on the router, [E], as GLM-4.5's) and its multi-token-prediction layer as ``mtp_*``
  tensors (left out).
* Kimi K2 names DeepSeek-V3's architecture ``kimi_k2`` (with remote code in ``auto_map``):
  held, and written, as ``deepseek_v3``, as transformers reads it.
* GLM-4.5 (``glm4_moe``) and DeepSeek-V3 (``deepseek_v3``) keep their multi-token-prediction
  layers (speculative decoding's draft, ``num_nextn_predict_layers``) as layers past the
  decoder's last: pivotflow leaves them out as it reads the folder, as transformers does, and
  its folders have none.
* gpt-oss (``gpt_oss``) names its router ``mlp.router`` and stores a layer's experts fused:
  ``mlp.experts.gate_up_proj`` [E, H, 2I] (input-major, gate and up interleaved by column),
  ``gate_up_proj_bias`` [E, 2I], ``down_proj`` [E, I, H], ``down_proj_bias`` [E, H].
  pivotflow holds each expert's projections as its own linears (``mlp.experts.E.gate_proj``),
  fuses them again for its folders, and sends vLLM one expert at a time (``oss_layout``).
  The Hub's files hold those stacks in MXFP4, dequantized as they are read.
* Granite 4.0 (``granitemoehybrid``) fuses its shared MLP's gate and up
  (``shared_mlp.input_linear``) and stacks its experts (``block_sparse_moe.input_linear``
  [E, 2I, H]): held as a dense MLP, or shared and routed experts (``granite_layout``).
* OLMo Hybrid (``olmo_hybrid``) keeps its DeltaNet projections and convolutions apart and
  names them, and its norms, its own way: held as Qwen3.5's (``olmo_hybrid_layout``).
* LFM2 (``lfm2``) names its norms, attention output and MLP its own way (``lfm2_layout``).
* Llama 4 (``llama4_text``) names each layer's feed-forward ``feed_forward`` (its router
  ``router``, its shared expert ``shared_expert``), stacks its experts input-major
  (``experts.gate_up_proj`` [E, H, 2I], ``experts.down_proj`` [E, I, H]) and rotates
  interleaved pairs: held under the common names, q/k rows reordered (``llama4_layout``);
  its wrapper, ``llama4`` (Llama4ForConditionalGeneration, Scout's and Maverick's), as the
  others below.
* Nemotron-H (``nemotron_h``) names its decoder ``backbone`` and each layer's one block
  ``mixer`` behind one ``norm``: held under every other family's names (``nemotron_layout``).
* Hunyuan (``hunyuan_v1_dense``, ``hunyuan_v1_moe``) names its q/k norms ``query_layernorm``
  and ``key_layernorm``, Hunyuan-MoE's router ``mlp.gate.wg`` and its shared MLP
  ``mlp.shared_mlp`` (held as ``q_norm``/``k_norm``, ``mlp.gate``, ``mlp.shared_experts``).
* Gemma 3 4B and larger (``gemma3``, Gemma3ForConditionalGeneration), Mistral Small 3.1+
  and Magistral Small 1.2 (``mistral3``, Mistral3ForConditionalGeneration) and Qwen3.5
  (``qwen3_5``, Qwen3_5ForConditionalGeneration) and Kimi K2.5 (``kimi_k25``: Kimi K2's text
  model, held as ``deepseek_v3``) wrap the text decoder
  (``language_model.model.*``, or ``model.language_model.*``; its config in ``text_config``)
  with a vision tower and projector: pivotflow holds the text model alone, as its own family
  (``gemma3_text``, ``mistral``, ``qwen3_5_text``: ``held_config``), and writes its causal
  LM's folders (Gemma3ForCausalLM, MistralForCausalLM, Qwen3_5ForCausalLM). Qwen3.5's
  multi-token-prediction layer (``mtp.*``) is left out as the folder is read. Qwen's
  vision-language models (``qwen2_vl``, ``qwen2_5_vl``: their decoder as a causal LM's,
  ``model.layers...``, beside ``visual.*``; ``qwen3_vl``, ``qwen3_vl_moe``:
  ``model.language_model.*``) are held as Qwen2's, Qwen3's and Qwen3-MoE's, Qwen3-VL-MoE's
  fused expert stacks split (``stacked_experts``); GLM-4.1V's (``glm4v``) and GLM-4.5V's
  (``glm4v_moe``) as GLM-4's and GLM-4.5's, then laid out as those are (``vl_text``);
  InternVL's and LLaVA's as the family their ``text_config`` names.

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
from pivotflow.params.afmoe_layout import TARGETS as AFMOE_TARGETS
from pivotflow.params.afmoe_layout import afmoe_disk, afmoe_held
from pivotflow.params.fp8_blocks import block_size, fp8_dequantized, is_fp8_blocks
from pivotflow.params.gemma4_layout import gemma4_disk, gemma4_engine, gemma4_held
from pivotflow.params.granite_layout import granite_engine, granite_fused, granite_split
from pivotflow.params.held_config import (
    GRANITE_FILES,
    MTP_APART,
    MTP_FAMILIES,
    WRAPPERS,
    family_of,
    held_config,
)
from pivotflow.params.lfm2_layout import TARGETS as LFM2_TARGETS
from pivotflow.params.lfm2_layout import lfm2_names
from pivotflow.params.llama4_layout import llama4_adapters, llama4_disk, llama4_engine, llama4_held
from pivotflow.params.mxfp4 import is_mxfp4, mxfp4_dequantized
from pivotflow.params.nemotron_layout import nemotron_adapters, nemotron_disk, nemotron_split
from pivotflow.params.olmo_hybrid_layout import TARGETS as OLMO_HYBRID_TARGETS
from pivotflow.params.olmo_hybrid_layout import (
    olmo_hybrid_adapters,
    olmo_hybrid_disk,
    olmo_hybrid_split,
)
from pivotflow.params.oss_layout import oss_engine, oss_fused, oss_split
from pivotflow.params.renamed_layout import (
    APERTUS_NORMS,
    APERTUS_NORMS_BACK,
    GLM_NORMS,
    GLM_NORMS_BACK,
    HUNYUAN_NAMES,
    HUNYUAN_NAMES_BACK,
    HY_V3_NAMES,
    block_router_name,
    ernie_statics,
    minimax_name,
    mixtral_name,
    renamed_modules,
    renamed_norms,
    turn_heads,
    turned_adapters,
)
from pivotflow.params.stacked_experts import split_stacks, stacked
from pivotflow.params.wrapper_layout import language_model, wrapper_adapters, wrapper_target

if TYPE_CHECKING:
    import torch

    from pivotflow.engines.torch.model_config import ModelConfig

_QKV, _GATE_UP = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"
_SHARED_IN = "shared_mlp.input_linear.weight"  # (Granite 4.0's shared MLP's gate and up)
_SPLIT_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_SPLIT_GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
# Qwen3-Next's DeltaNet projections, fused and grouped by key head (``_grouped_order``), as
# Qwen3.5 holds them split
_QKVZ, _BA = "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight"
_SPLIT_QKVZ = ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight")
_SPLIT_BA = ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight")
# each family's fused projections: (the file's tensor, the parts pivotflow holds, in rows order)
_FUSED = {"phi3": ((_QKV, _SPLIT_QKV), (_GATE_UP, _SPLIT_GATE_UP)),
          "glm4": ((_GATE_UP, _SPLIT_GATE_UP),),  # (GLM-4 keeps q, k and v apart)
          "qwen3_next": ((_QKVZ, _SPLIT_QKVZ), (_BA, _SPLIT_BA)),
          # (adapters only: granite_layout lays the tensors out; a dense layer's shared MLP is
          # held as its mlp, a sparse one's as its shared experts)
          **dict.fromkeys(GRANITE_FILES, ((_SHARED_IN, _SPLIT_GATE_UP),
                                          (_SHARED_IN, ("mlp.shared_experts.gate_proj.weight",
                                                        "mlp.shared_experts.up_proj.weight"))))}
# the families whose rope turns interleaved pairs, held with each head's q/k rows reordered
# (``turn_heads``; ERNIE 4.5 MoE's too, its router's bias renamed beside)
_TURNED = ("ernie4_5", "cohere2", "cohere")
# Granite 4.0's shared MLP's down projection, held as a dense MLP's or as shared experts'
_GRANITE_DOWN = re.compile(r"(.*\.)mlp\.(?:shared_experts\.)?down_proj\.(lora_[AB])")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")  # (a layer's tensors: its number)
# ERNIE 4.5 MoE's multi-token-prediction tensors (``model.mtp_block.0...``, ``mtp_emb_norm``...)
_ERNIE_MTP = re.compile(r"(?:model\.)?mtp_")


def _module(tensor: str) -> str:
    """A weight's module name (``self_attn.qkv_proj.weight`` -> ``self_attn.qkv_proj``)."""
    return tensor.removesuffix(".weight")


def _geometry(config: dict[str, Any], where: str) -> ModelConfig:
    """The decoder ``config`` describes, as ``config_from_hf`` reads it: the head counts,
    head_dim, rotary share and MLP width a layout change needs, with transformers' defaults
    applied in one place."""
    from pivotflow.engines.torch.hf_config import config_from_hf

    return config_from_hf(held_config(config, where), where)


def _grouped_order(cfg: ModelConfig, fused: str) -> torch.Tensor | None:
    """Qwen3-Next's fused DeltaNet rows come grouped by key head, each group its q, k, then
    its value heads' v and z rows (``in_proj_qkvz``), or their b, then a rows
    (``in_proj_ba``): the order ``order`` with file rows = parts-concatenated rows[order]
    (None for any other fused tensor)."""
    if fused not in (_QKVZ, _BA):
        return None
    import torch

    groups, per = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, dv = (cfg.linear_key_head_dim, cfg.linear_value_head_dim) if fused == _QKVZ else (0, 1)
    # the concatenated blocks: q, k (a key head's dk rows each), v, z (a group's per * dv)
    sizes = (dk, dk, per * dv, per * dv) if fused == _QKVZ else (per, per)
    starts = [0]
    for size in sizes[:-1]:
        starts.append(starts[-1] + size * groups)
    return torch.cat([torch.arange(start + g * size, start + (g + 1) * size)
                      for g in range(groups) for start, size in zip(starts, sizes, strict=True)])


def _part_rows(cfg: ModelConfig, fused: str) -> tuple[int, ...]:
    """The rows each part of ``fused`` (qkv_proj, gate_up_proj, in_proj_qkvz, in_proj_ba)
    holds, in order."""
    if fused == _QKVZ:
        value = cfg.linear_num_value_heads * cfg.linear_value_head_dim
        return 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + value, value
    if fused == _BA:
        return cfg.linear_num_value_heads, cfg.linear_num_value_heads
    if fused == _QKV:
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        return q, kv, kv
    if fused == _SHARED_IN:  # (Granite 4.0's: a dense layer's MLP, or its shared experts)
        width = cfg.shared_width or cfg.intermediate_size
        return width, width
    return cfg.intermediate_size, cfg.intermediate_size


def held_layout(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], where: str
) -> dict[str, torch.Tensor]:
    """``tensors`` as pivotflow holds them: fused projections split into views (phi3, glm4),
    Mixtral's and GLM-4's names renamed, GLM-4's q/k rows reordered (``turn_heads``),
    GLM-4.5's multi-token-prediction layers left out, a Gemma 3 wrapper's text model alone
    (``wrapper_layout.language_model``), gpt-oss's MXFP4 experts dequantized (``mxfp4``), a
    block-wise FP8 folder's weights dequantized (``fp8_blocks``),
    every other tensor as it is. Raises ModelConfigError naming ``where`` and the tensor whose rows
    do not split as the config says."""
    if is_fp8_blocks(config):
        tensors = fp8_dequantized(tensors, block_size(config, where), where)
    family = family_of(config)
    if family == "mixtral":
        return {mixtral_name(name, to_disk=False): t for name, t in tensors.items()}
    if family == "minimax_m2":  # (Mixtral's names, its router's bias on the block; MTP past)
        cfg = _geometry(config, where)
        return {minimax_name(name, to_disk=False): t for name, t in tensors.items()
                if (m := _LAYER.match(name)) is None or int(m.group(1)) < cfg.num_hidden_layers}
    if family in GRANITE_FILES:
        return granite_split(tensors, where)
    if family == "nemotron_h":
        return nemotron_split(_geometry(config, where), tensors)
    if family == "olmo_hybrid":
        return olmo_hybrid_split(tensors)
    if family in ("lfm2", "lfm2_moe"):
        return lfm2_names(tensors, to_disk=False)
    if family in ("hunyuan_v1_dense", "hunyuan_v1_moe"):
        return renamed_modules(tensors, HUNYUAN_NAMES)
    if family == "afmoe":  # (its attention's gate inside q_proj, its router's names)
        return afmoe_held(_geometry(config, where), tensors, where)
    if family == "apertus":  # (its norms' names)
        return renamed_norms(tensors, APERTUS_NORMS)
    if family == "hy_v3":  # (its router's, its bias's and its shared MLP's names)
        return {block_router_name(n, HY_V3_NAMES, to_disk=False): t for n, t in tensors.items()}
    if family == "mistral4":  # (its module's own expert stacks: stacked_experts)
        return split_stacks(_geometry(config, where), tensors, where, either_way=False)
    if family == "gemma4_text":  # (its router and expert stacks on the layer)
        return gemma4_held(_geometry(config, where), tensors, where)
    if family == "llama4_text":  # (its feed_forward's names, input-major stacks, turned q/k)
        return llama4_held(_geometry(config, where), tensors, where)
    if family in _TURNED:  # (their rotary pairs interleaved, as GLM-4's)
        return turn_heads(_geometry(config, where), tensors, where, to_disk=False)
    if family == "ernie4_5_moe":  # (and its router's bias on moe_statics; MTP left out)
        decoder = {n: t for n, t in tensors.items() if not _ERNIE_MTP.match(n)}
        return turn_heads(_geometry(config, where), ernie_statics(decoder, to_disk=False),
                          where, to_disk=False)
    if family is None:
        return tensors
    if family in WRAPPERS:  # (the text model's, then laid out as its own family's)
        text = held_config(config, where)
        if family in ("qwen3_vl_moe", "glm46v"):  # (experts stacked, as its text family's not)
            tensors = split_stacks(_geometry(text, where), tensors, where)
        inner = language_model(tensors)
        return held_layout(text, inner, where) if family_of(text) else inner
    if family in MTP_APART:
        tensors = {name: t for name, t in tensors.items() if not name.startswith("mtp.")}
        if family not in _FUSED:
            return tensors
    if family == "gpt_oss":
        return oss_split(mxfp4_dequantized(tensors, where) if is_mxfp4(config) else tensors,
                          where)
    cfg = _geometry(config, where)
    if family in MTP_FAMILIES:
        return {name: t for name, t in tensors.items()
                if (m := _LAYER.match(name)) is None or int(m.group(1)) < cfg.num_hidden_layers}
    held = _split(cfg, _FUSED[family], tensors, where)
    if family == "glm4":
        return turn_heads(cfg, renamed_norms(held, GLM_NORMS), where, to_disk=False)
    return held


def _split(cfg: ModelConfig, fusions: tuple[tuple[str, tuple[str, ...]], ...],
           tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Each of ``fusions``' fused tensors split by rows into views of its parts."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        fused, parts = next(((f, p) for f, p in fusions if name.endswith(f)), ("", ()))
        if not parts:
            out[name] = t
            continue
        rows = _part_rows(cfg, fused)
        if t.dim() != 2 or t.shape[0] != sum(rows):
            raise ModelConfigError(
                f"{where}: tensor {name!r} has shape {tuple(t.shape)}, which does not split "
                f"into {' + '.join(map(str, rows))} rows ({', '.join(p.split('.')[1] for p in parts)})"
            )
        prefix = name[: -len(fused)]
        order = _grouped_order(cfg, fused)
        if order is not None:  # (Qwen3-Next's: its parts' rows back together first)
            t = t.index_select(0, order.argsort().to(t.device))
        for part, chunk in zip(parts, t.split(list(rows)), strict=True):
            out[prefix + part] = chunk
    return out


def engine_names(config: dict[str, Any],
                 tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` as an engine's checkpoint loader reads them (Mixtral's and GLM-4's names,
    GLM-4's q/k rows in its own order, gpt-oss's experts one at a time: ``oss_layout.oss_engine``),
    nothing fused: vLLM and SGLang stack split projections themselves."""
    family = family_of(config)
    if family == "mixtral":
        return {mixtral_name(name, to_disk=True): t for name, t in tensors.items()}
    if family == "minimax_m2":
        return {minimax_name(name, to_disk=True): t for name, t in tensors.items()}
    if family == "gpt_oss":
        return oss_engine(tensors)
    if family in GRANITE_FILES:
        return granite_engine(tensors)
    if family == "nemotron_h":  # (vLLM's loader reads the file's names)
        return nemotron_disk(tensors)
    if family == "olmo_hybrid":
        return olmo_hybrid_disk(_geometry(config, "engine export"), tensors)
    if family in ("ernie4_5_moe", *_TURNED):
        turned = turn_heads(_geometry(config, "engine export"), tensors, "engine export",
                            to_disk=True)
        return ernie_statics(turned, to_disk=True) if family == "ernie4_5_moe" else turned
    if family in ("lfm2", "lfm2_moe"):
        return lfm2_names(tensors, to_disk=True)
    if family in ("hunyuan_v1_dense", "hunyuan_v1_moe"):
        return renamed_modules(tensors, HUNYUAN_NAMES_BACK)
    if family == "afmoe":
        return afmoe_disk(_geometry(config, "engine export"), tensors)
    if family == "apertus":
        return renamed_norms(tensors, APERTUS_NORMS_BACK)
    if family == "hy_v3":
        return {block_router_name(n, HY_V3_NAMES, to_disk=True): t for n, t in tensors.items()}
    if family == "gemma4_text":
        return gemma4_engine(tensors)
    if family == "llama4_text":
        return llama4_engine(_geometry(config, "engine export"), tensors)
    if family == "qwen3_next":  # (vLLM's Qwen3-Next loads its file's fused, grouped rows)
        return _fused(config, tensors)
    if family == "glm4":
        turned = turn_heads(_geometry(config, "engine export"), tensors, "engine export",
                             to_disk=True)
        return renamed_norms(turned, GLM_NORMS_BACK)
    return tensors


def disk_layout(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` as the family stores them: Mixtral's and GLM-4's names and order, split
    projections fused again (phi3, glm4, qwen3_next; a layer holding only some of the parts
    keeps them split), every other tensor as it is."""
    family = family_of(config)
    if family == "gpt_oss":
        return oss_fused(tensors)
    if family in GRANITE_FILES:
        return granite_fused(tensors)
    if family == "mistral4":
        return stacked(tensors)
    if family == "gemma4_text":
        return gemma4_disk(tensors)
    if family == "llama4_text":
        return llama4_disk(_geometry(config, "disk layout"), tensors)
    # (Nemotron-H's, OLMo Hybrid's and ERNIE 4.5's: what engine_names gives)
    return _fused(config, engine_names(config, tensors))


def _fused(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The family's split projections fused (``_FUSED``; Qwen3-Next's rows then grouped by
    key head), every other tensor as it is."""
    family = family_of(config)
    if family not in _FUSED:
        return tensors
    import torch

    out, cfg = dict(tensors), None
    for name in tensors:
        for fused, parts in _FUSED[family]:
            if not name.endswith(parts[0]):
                continue
            prefix = name[: -len(parts[0])]
            names = [prefix + p for p in parts]
            if all(n in out for n in names):
                whole = torch.cat([out.pop(n) for n in names])
                cfg = cfg or _geometry(config, "disk layout")
                order = _grouped_order(cfg, fused)
                out[prefix + fused] = whole if order is None else whole[order.to(whole.device)]
    return out


def fused_adapters(config: dict[str, Any], adapters: dict[str, torch.Tensor], rank: int,
                   alpha: float) -> tuple[dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """LoRA adapters of split projections (``<layer>.lora_A`` [r, in], ``.lora_B`` [out, r])
    as adapters of the file's fused ones (phi3; glm4's gate/up, its q/k rows put back in its
    order), with PEFT's ``rank_pattern`` and ``alpha_pattern`` for them; others as they are. n adapted parts of a fused projection make
    one adapter of rank n r: A the parts' A stacked, B block-diagonal over the parts' rows
    (zero rows for a part not adapted), alpha n alpha, so its update is the parts' updates
    exactly, scale alpha / r included. A multimodal wrapper's (``WRAPPERS``): its text
    model's, under the names transformers' wrapper class gives that model
    (``wrapper_adapters``), which PEFT loads the adapter onto."""
    family = family_of(config)
    if family in WRAPPERS:
        text = held_config(config, "adapter export")
        inner, inner_ranks, inner_alphas = fused_adapters(text, adapters, rank, alpha)
        return wrapper_adapters(family, inner), inner_ranks, inner_alphas
    if family == "nemotron_h":  # (renamed, nothing fused)
        return nemotron_adapters(adapters), {}, {}
    if family == "olmo_hybrid":  # (its DeltaNet's q/k/v apart, the rest renamed)
        return olmo_hybrid_adapters(_geometry(config, "adapter export"), adapters), {}, {}
    if family in ("lfm2", "lfm2_moe"):  # (renamed, nothing fused)
        return lfm2_names(adapters, to_disk=True), {}, {}
    if family == "hy_v3":  # (its shared MLP's and router's names)
        return {block_router_name(n, HY_V3_NAMES, to_disk=True): t
                for n, t in adapters.items()}, {}, {}
    if family == "gemma4_text":  # (its experts' adapters under the file's names)
        return gemma4_engine(adapters), {}, {}
    if family == "llama4_text":  # (q's and k's B rows interleaved, its feed_forward's names)
        return llama4_adapters(_geometry(config, "adapter export"), adapters), {}, {}
    if family == "afmoe":  # (q_proj's adapter as the file's q_proj's and gate_proj's)
        return afmoe_disk(_geometry(config, "adapter export"), adapters), {}, {}
    if family in ("hunyuan_v1_dense", "hunyuan_v1_moe"):  # (Hunyuan-MoE's shared MLP renamed)
        return renamed_modules(adapters, HUNYUAN_NAMES_BACK), {}, {}
    if family in ("ernie4_5_moe", *_TURNED):  # (q's and k's B rows interleaved)
        return turned_adapters(_geometry(config, "adapter export"), adapters), {}, {}
    if family not in _FUSED:
        return adapters, {}, {}
    import torch

    cfg = _geometry(config, "adapter export")
    out = turned_adapters(cfg, adapters) if family == "glm4" else dict(adapters)
    ranks: dict[str, int] = {}
    for fused, parts in _FUSED[family]:
        rows = _part_rows(cfg, fused)
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
            order = _grouped_order(cfg, fused)
            if order is not None:  # (Qwen3-Next's: B's rows are the fused rows, grouped)
                b = b[order.to(b.device)]
            out[f"{prefix}{_module(fused)}.lora_A"], out[f"{prefix}{_module(fused)}.lora_B"] = a, b
            key = _module(fused).split(".")[-1]  # (PEFT matches a pattern on the name's end)
            if ranks.setdefault(key, len(present) * rank) != len(present) * rank:
                raise ValueError(f"{key}: layers adapt different parts; PEFT's rank_pattern "
                                 "cannot say it")
    if family in GRANITE_FILES:  # (its shared MLP's down projection: output_linear)
        out = {(f"{m.group(1)}shared_mlp.output_linear.{m.group(2)}"
                if (m := _GRANITE_DOWN.fullmatch(k)) else k): t for k, t in out.items()}
    return out, ranks, {k: alpha * r / rank for k, r in ranks.items()}


def fused_targets(config: dict[str, Any], targets: list[str]) -> list[str] | str:
    """LoRA's target module names as the family's file names them: a split projection's as
    its fused one's (phi3, glm4), in order, once each; others as they are. A wrapper's: one
    pattern (PEFT's ``target_modules`` as a string) naming its text model's alone."""
    family = family_of(config)
    if family in WRAPPERS:  # (the text model's, its names alone: not the vision tower's)
        names = fused_targets(held_config(config, "adapter export"), targets)
        return wrapper_target(family, [names] if isinstance(names, str) else names)
    if family == "olmo_hybrid":
        return list(dict.fromkeys(n for t in targets for n in OLMO_HYBRID_TARGETS.get(t, (t,))))
    if family in ("lfm2", "lfm2_moe"):
        return list(dict.fromkeys(LFM2_TARGETS.get(t, t) for t in targets))
    if family == "afmoe":
        return list(dict.fromkeys(n for t in targets for n in AFMOE_TARGETS.get(t, (t,))))
    if family not in _FUSED:
        return list(targets)
    fused = {_module(p).split(".")[-1]: _module(f).split(".")[-1]
             for f, parts in _FUSED[family] for p in parts}
    if family in GRANITE_FILES:
        fused["down_proj"] = "output_linear"
    return list(dict.fromkeys(fused.get(t, t) for t in targets))
