"""Where a multimodal wrapper (``held_config.WRAPPERS``: Gemma 3's and 4's, Llama 4's, Mistral
3's, the Qwen-VLs', GLM-V's, InternVL's, LLaVA's) keeps its text model: in its files, which
pivotflow reads as that model alone (``language_model``), and in transformers 5's wrapper class,
whose module names a PEFT adapter of the text model must use (``wrapper_adapters``,
``wrapper_target``). ``hf_layout`` lays the text model out as its own family's after these.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# the text model in a wrapper's file: ``language_model.model.X`` or ``model.language_model.X``
_TEXT_MODEL = re.compile(r"(?:language_model\.|model\.language_model\.)(model\.)?(.*)")
# a decoder's own tensors where a wrapper's file keeps them as a causal LM's (Qwen2-VL's and
# Qwen2.5-VL's, their vision tower beside as ``visual.*``)
_DECODER = re.compile(r"model\.(?:embed_tokens|layers|norm)\..*")
# where transformers 5's wrapper classes hold their text model's decoder (``model.X`` of a
# causal LM): under their ``model.language_model`` (Gemma 3's, Gemma 4's, Mistral 3's, the
# Qwen-VLs', GLM-V's, InternVL's, LLaVA's), or Llama 4's under ``language_model.model``
_WRAPPED_DECODER = {"llama4": "language_model.model."}


def language_model(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A multimodal wrapper's text model under a causal LM's names: ``language_model.model.X``
    (the Hub's files, and transformers' save_pretrained) or ``model.language_model.X``
    (transformers 5 in memory; Qwen3-VL's files) as ``model.X``, ``model.X`` of a decoder
    (Qwen2.5-VL's files) as it is, ``language_model.lm_head.weight`` or ``lm_head.weight`` as
    ``lm_head.weight``; the vision tower and projector left out."""
    out = {}
    for name, t in tensors.items():
        if name == "lm_head.weight" or name == "language_model.lm_head.weight":
            out["lm_head.weight"] = t
        elif (m := _TEXT_MODEL.fullmatch(name)) is not None:
            out[f"model.{m.group(2)}"] = t
        elif _DECODER.fullmatch(name) is not None:
            out[name] = t
    return out


def _decoder_prefix(family: str) -> str:
    """The ``family`` wrapper class's module path to its text model's decoder."""
    return _WRAPPED_DECODER.get(family, "model.language_model.")


def wrapper_adapters(family: str, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A text model's adapters (``model.layers...``) under the names the ``family`` wrapper
    class gives them in transformers 5 (what PEFT's module names are there)."""
    prefix = _decoder_prefix(family)
    return {(prefix + k.removeprefix("model.") if k.startswith("model.") else k): t
            for k, t in adapters.items()}


def wrapper_target(family: str, names: list[str]) -> str:
    """PEFT's ``target_modules`` for a wrapper: a pattern matching those modules of its text
    model's layers alone (a vision tower's ``q_proj`` is not adapted)."""
    prefix = _decoder_prefix(family)
    return rf"{re.escape(prefix)}layers\.\d+\.(?:.*\.)?(?:{'|'.join(map(re.escape, names))})"
