"""LoRA for the trainer (Hu et al. 2021, arXiv:2106.09685; verl's and OpenRLHF's ``lora_rank``,
TRL's ``peft_config``): each targeted linear layer keeps its weight ``W0`` frozen and trains a
low-rank update, ``W = W0 + (alpha / rank) B A`` with ``A`` [rank, in] and ``B`` [out, rank].

Only ``A`` and ``B`` take gradients and AdamW state, so the optimizer's memory is the adapters'
(about ``2 rank (in + out)`` numbers a layer instead of ``2 in out``). Everything outside the
trainer sees plain weights: the policy a trainer publishes is merged (``merged_state_dict``), so
rollout engines, vLLM, the reference role and checkpoints' policy folders read an ordinary Hugging
Face model, and what the adapters are sits in the optimizer state beside AdamW's moments
(``adapter_tensors``); each checkpoint writes them as PEFT saves them too (``peft_adapter``).

A trainer that takes over the pool's state (another trainer left, a run resumes) loads the merged
policy and the adapters and gets its frozen base back as ``W - (alpha / rank) B A`` in float32
(``restore``): exact up to one rounding of float32 per take-over, which is why LoRA needs
``train_dtype`` float32 (bf16 would round the merged weight, and small updates with it).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pivotflow.defaults import LORA_TARGETS
from pivotflow.errors import ModelConfigError

__all__ = ["LORA_TARGETS", "LoRALinear", "adapter_tensors", "adapters_off", "apply_lora",
           "merge_peft_adapter", "merged_state_dict", "peft_adapter", "restore"]
ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


class LoRALinear(nn.Linear):
    """A linear layer with a LoRA update. Its ``weight`` (and ``bias``) keep their Hugging Face
    names and stay frozen; ``lora_A`` and ``lora_B`` are the trained parameters."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float,
                 generator: torch.Generator) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.scaling = alpha / rank
        w = base.weight
        # PEFT's initialisation: A as nn.Linear's default (Kaiming uniform, a = sqrt(5)), B zero,
        # so the adapted model starts as the base model exactly. A comes from ``generator`` on
        # the host, seeded with the run's seed: every trainer of the pool draws the same A.
        bound = 1 / math.sqrt(self.in_features)
        a = torch.rand(rank, self.in_features, generator=generator, dtype=torch.float64)
        self.lora_A = nn.Parameter((a * 2 - 1).mul_(bound).to(w.device, w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=w.device,
                                               dtype=w.dtype))

    def delta(self) -> torch.Tensor:
        """``(alpha / rank) B A``: what the adapters add to the frozen weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the update through the rank-r bottleneck, never as a full matrix
        return F.linear(x, self.weight, self.bias) + F.linear(
            F.linear(x, self.lora_A), self.lora_B) * self.scaling


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: list[str],
               seed: int = 0) -> int:
    """Replace every linear layer named in ``targets`` (LORA_TARGETS' names) with a LoRALinear
    and freeze the rest of ``model``. Returns how many layers took adapters."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if name in targets and isinstance(child, nn.Linear) and not isinstance(
                    child, LoRALinear):
                setattr(parent, name, LoRALinear(child, rank, alpha, generator))
                swapped += 1
    return swapped


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """The base model for the duration: every adapter's update left out (verl's reference
    logprobs under LoRA, computed by the actor with its adapters disabled)."""
    layers = [layer for _, layer in _lora_layers(model)]
    scales = [layer.scaling for layer in layers]
    for layer in layers:
        layer.scaling = 0.0
    try:
        yield
    finally:
        for layer, scale in zip(layers, scales, strict=True):
            layer.scaling = scale


def _lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state under Hugging Face names with each adapter merged into its weight:
    what a plain (unadapted) model of the same config loads."""
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith(ADAPTER_SUFFIXES)}
    for name, layer in _lora_layers(model):
        # each merged weight is a new tensor: on a GPU it goes to the host at once (the store
        # copies it there anyway), so the device never holds a second copy of the model
        sd[f"{name}.weight"] = (layer.weight + layer.delta()).cpu()
    return sd


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{"<layer>.lora_A": A, "<layer>.lora_B": B}`` (views), in module order."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in _lora_layers(model):
        out[f"{name}.lora_A"], out[f"{name}.lora_B"] = layer.lora_A.data, layer.lora_B.data
    return out


@torch.no_grad()
def restore(model: nn.Module, adapters: dict[str, torch.Tensor]) -> list[str]:
    """After the merged policy was loaded into the layers' weights: copy the adapters in and
    take their update back out of each weight (``W0 = W - (alpha / rank) B A``). Returns the
    adapter names missing from ``adapters`` or of another shape (nothing is changed then)."""
    mine = adapter_tensors(model)
    bad = [k for k, t in mine.items()
           if k not in adapters or adapters[k].shape != t.shape]
    if bad:
        return bad
    for k, t in mine.items():
        t.copy_(adapters[k])
    for _, layer in _lora_layers(model):
        layer.weight.sub_(layer.delta())
    return []


def peft_adapter(adapters: dict[str, torch.Tensor], *, alpha: float, targets: list[str],
                 base_model: str, model_config: dict[str, object] | None = None,
                 ) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The adapters as PEFT saves them (``adapter_model.safetensors``'s tensors and
    ``adapter_config.json``), so ``PeftModel.from_pretrained(base, folder)`` loads them onto
    ``base_model`` (the policy's folder before training). ``adapters`` as ``adapter_tensors``
    names them (the optimizer state's ``<layer>.lora_A`` / ``.lora_B``). ``model_config``
    (the base's config.json): a family whose file fuses projections (Phi-3) gets adapters of
    its fused ones (``hf_layout.fused_adapters``, with rank and alpha patterns); a multimodal
    wrapper's, its text model's under the wrapper's names for them."""
    from pivotflow.params.hf_layout import fused_adapters, fused_targets

    ranks = {t.shape[0] for k, t in adapters.items() if k.endswith(".lora_A")}
    if len(ranks) != 1:
        raise ValueError(f"adapters of ranks {sorted(ranks)}: expected one rank")
    rank = ranks.pop()
    model_config = dict(model_config or {})
    adapters, rank_pattern, alpha_pattern = fused_adapters(model_config, adapters, rank, alpha)
    # (a wrapper's: one pattern, its text model's modules alone)
    file_targets = fused_targets(model_config, targets)
    tensors = {f"base_model.model.{k}.weight": t for k, t in adapters.items()}
    config: dict[str, object] = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": rank, "lora_alpha": alpha, "target_modules": file_targets,
        "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "use_dora": False, "init_lora_weights": True, "inference_mode": True,
        "modules_to_save": None,
    }
    return tensors, config


def merge_peft_adapter(tensors: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """``tensors`` (a model's, Hugging Face names) with the PEFT LoRA adapter saved in
    ``folder`` merged in: ``W + (lora_alpha / r) B A`` for every adapted layer, computed in
    float32 and stored in W's dtype. What a run starts from when its model is an SFT adapter on a
    base (``Graph.model(..., adapter=)``). Raises ModelConfigError naming the file and what is
    wrong: not a LoRA adapter, a kind this does not merge (DoRA), or a layer the model does not
    have or of another shape. rsLoRA's scale (alpha / sqrt(r)) and per-layer ranks and alphas
    (``rank_pattern``, ``alpha_pattern``) are kept."""
    from safetensors.torch import load_file

    config_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ModelConfigError(f"{path}: no such file (a PEFT adapter folder holds "
                                   "adapter_config.json and adapter_model.safetensors)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{config_path}: unreadable ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else None
        raise ModelConfigError(f"{config_path}: peft_type {kind!r}; only LORA adapters merge")
    for key in ("use_dora", "fan_in_fan_out"):
        if config.get(key):
            raise ModelConfigError(f"{config_path}: {key} is true; not supported")
    r, alpha = config.get("r"), config.get("lora_alpha")
    patterns = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)) or not all(
            isinstance(d, dict) for d in patterns):
        raise ModelConfigError(f"{config_path}: r {r!r} and lora_alpha {alpha!r} must be a "
                               "positive int and a number, rank_pattern and alpha_pattern "
                               "objects")

    def scaling(layer: str) -> float:
        """PEFT's scale of ``layer``: its rank and alpha from the first pattern whose regex
        matches the end of its name (PEFT's ``get_pattern_key``), else r and lora_alpha."""
        try:
            rank, a = (next((d[k] for k in d if re.match(rf"(.*\.)?({k})$", layer)), default)
                       for d, default in zip(patterns, (r, alpha), strict=True))
        except re.error as exc:
            raise ModelConfigError(f"{config_path}: a rank_pattern or alpha_pattern key is "
                                   f"not a regular expression: {exc}") from None
        return a / math.sqrt(rank) if config.get("use_rslora") else a / rank

    adapter = load_file(str(weights_path))
    merged, layers = dict(tensors), 0
    for key, a in adapter.items():
        if not key.endswith(".lora_A.weight"):
            continue
        layer = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        b = adapter.get(key.replace(".lora_A.", ".lora_B."))
        w = tensors.get(f"{layer}.weight")
        if b is None or w is None or w.shape != (b.shape[0], a.shape[1]):
            raise ModelConfigError(
                f"{weights_path}: {key} does not fit the model (its lora_B "
                f"{'missing' if b is None else tuple(b.shape)}, the model's {layer}.weight "
                f"{'missing' if w is None else tuple(w.shape)})")
        merged[f"{layer}.weight"] = (w.float() + scaling(layer) * (b.float() @ a.float())
                                     ).to(w.dtype)
        layers += 1
    if not layers:
        raise ModelConfigError(f"{weights_path}: no lora_A/lora_B pair: nothing to merge")
    return merged
