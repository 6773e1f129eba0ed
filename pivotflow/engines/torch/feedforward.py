"""The feed-forward half of a decoder layer: the dense SwiGLU ``MLP``, and the routed mixture
of experts (``SparseMoE``: Qwen3-MoE's, Mixtral's and Qwen2-MoE's softmax router, GLM-4.5's
grouped sigmoid router; shared experts) with its routing: ``Routing``/``route``, the replayed
route of routing replay (R3), the bytes recorded routing travels as, the one loop that combines
a layer's experts (``add_expert_outputs``, which the engine's ``experts.PackedExperts``
shares), and the load-balancing loss a trainer may add (``LoadBalance``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from pivotflow.engines.torch.model_config import ModelConfig


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP's gate by HF's ``hidden_act`` name: SiLU (SwiGLU), Gemma's tanh-GELU (GeGLU),
    or Nemotron-H's squared ReLU (no gate: its whole activation)."""
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu2":
        return lambda x: F.relu(x).square()
    if name == "xielu":
        raise ValueError("xielu has learned scalars in each layer: feedforward.XIELU")
    return F.silu


class XIELU(nn.Module):
    """Apertus's activation, xIELU (arXiv:2411.13010), with its layer's learned scalars as
    transformers names them (``mlp.act_fn.alpha_p`` [1], ``alpha_n`` [1]) and its constants
    (``beta``, ``eps``: 0-d, held frozen): x > 0 gives a x^2 + beta x, a = softplus(alpha_p);
    otherwise (expm1(min(x, eps)) - x) b + beta x, b = beta + softplus(alpha_n)."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1))
        self.alpha_n = nn.Parameter(torch.zeros(1))
        self.beta = nn.Parameter(torch.tensor(0.5), requires_grad=False)
        self.eps = nn.Parameter(torch.tensor(-1e-6), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.minimum(x, self.eps)) - x) * alpha_n + self.beta * x)


class MLP(nn.Module):
    """Gated feed-forward (SwiGLU, or GeGLU for Gemma) of ``size`` hidden units (default: the
    config's intermediate_size); a gpt-oss expert (``expert`` on a config with a
    ``swiglu_limit``) has biases and its clamped gate (``clamped_glu``); Nemotron-H's and
    Arcee's have no gate (``up_proj``, relu(x)^2, ``down_proj``), nor Apertus's, whose
    activation has learned scalars of its own (``act_fn``: ``XIELU``)."""

    def __init__(self, cfg: ModelConfig, size: int = 0, expert: bool = False) -> None:
        super().__init__()
        size = size or cfg.intermediate_size
        self.limit, self.alpha = (cfg.swiglu_limit, cfg.swiglu_alpha) if expert else (0.0, 0.0)
        bias = bool(self.limit)
        self.gated = cfg.mlp_gated
        if self.gated:
            self.gate_proj = nn.Linear(cfg.hidden_size, size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, size, bias=bias)
        self.down_proj = nn.Linear(size, cfg.hidden_size, bias=bias)
        # (Apertus's xIELU: a module of the layer's, ``act_fn`` as HF names it, called through
        # a method, so it is registered once)
        self.act: Callable[[torch.Tensor], torch.Tensor]
        if cfg.hidden_act == "xielu":
            self.act_fn = XIELU()
            self.act = self._learned_act
        else:
            self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.down_proj(self.act(self.up_proj(x)))
        if self.limit:
            return self.down_proj(clamped_glu(self.gate_proj(x), self.up_proj(x), self.limit,
                                              self.alpha))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    def _learned_act(self, x: torch.Tensor) -> torch.Tensor:
        return self.act_fn(x)  # type: ignore[no-any-return]


def clamped_glu(gate: torch.Tensor, up: torch.Tensor, limit: float,
                alpha: float) -> torch.Tensor:
    """gpt-oss's gate: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), where
    g = min(gate, limit)."""
    gate = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))


class Routing(NamedTuple):
    """How a sparse layer picks and weighs a token's experts (``ModelConfig``'s router fields):
    ``top_k`` of them, scored by ``scoring`` ("softmax" over all, each by a "sigmoid", or
    "topk_softmax": the logits choose, a softmax over the chosen weighs), chosen by score (plus
    a sigmoid router's correction bias) among the ``topk_group`` best of ``n_group`` groups,
    weighed by their scores, renormalised to sum to 1 when ``normalize``, times ``scale``."""

    top_k: int
    normalize: bool
    scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0
    group_rank_top: int = 2  # (a group ranks by the sum of its this many best scores)
    biased: bool = False  # (its logits in float32, its choice by a correction bias too)
    norm_eps: float = 1e-20  # (a sigmoid router's, added to the sum it renormalises by)
    scales_input: bool = False  # (Llama 4's: an expert reads its token times its weight)

    @staticmethod
    def of(cfg: ModelConfig) -> Routing:
        return Routing(cfg.num_experts_per_tok, cfg.norm_topk_prob, cfg.scoring_func,
                       cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor,
                       cfg.group_rank_top, cfg.router_bias, cfg.router_norm_eps,
                       cfg.router_scales_input)

    def scores(self, router_logits: torch.Tensor) -> torch.Tensor:
        """Every expert's score [n, E], in float32 (gpt-oss's: its logits, which choose; the
        chosen ones' softmax weighs them, ``finish``)."""
        if self.scoring == "sigmoid":
            return torch.sigmoid(router_logits.float())
        if self.scoring == "topk_softmax":
            return router_logits.float()
        return torch.softmax(router_logits, dim=-1, dtype=torch.float32)

    def choose(self, scores: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Each token's ``top_k`` experts [n, k] by ``scores`` plus ``bias`` (which only
        chooses: it never weighs), within its ``topk_group`` best groups (a group ranked by
        the sum of its ``group_rank_top`` best: two, as DeepSeek-V3 and transformers' GLM-4.5
        choose; one, DeepSeek-V2's group_limited_greedy)."""
        ranked = scores if bias is None else scores + bias.float()
        if self.n_group > 1:
            groups = ranked.view(ranked.shape[0], self.n_group, -1)
            best = (groups.topk(self.group_rank_top, dim=-1).values.sum(-1)
                    .topk(self.topk_group, dim=-1).indices)
            keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter_(1, best, True)
            ranked = groups.masked_fill(~keep[..., None], float("-inf")).view_as(ranked)
        return torch.topk(ranked, self.top_k, dim=-1).indices

    def weigh(self, scores: torch.Tensor, chosen: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
        """The weights [n, k] of ``chosen`` experts, in ``dtype``."""
        return self.finish(scores.gather(-1, chosen), dtype)

    def finish(self, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The chosen experts' scores [n, k] as their weights, in ``dtype``."""
        if self.scoring == "topk_softmax":
            weights = torch.softmax(weights, dim=-1)
        if self.normalize:
            total = weights.sum(dim=-1, keepdim=True)
            # (a sigmoid router's scores may all be ~0: transformers' epsilon, as GLM-4.5's)
            weights = weights / (total + self.norm_eps if self.scoring == "sigmoid" else total)
        if self.scale != 1.0:
            weights = weights * self.scale
        return weights.to(dtype)


def router_logits(gate: nn.Linear, x: torch.Tensor, routing: Routing) -> torch.Tensor:
    """The router's logits [n, E] for ``x`` [n, H]: a biased router's (every sigmoid one's,
    ERNIE 4.5 MoE's) in float32 (under autocast too), as transformers' and vLLM's GLM-4.5
    compute them, another's in ``x``'s dtype."""
    if routing.biased:
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), gate.weight.float())
    return gate(x)


def router_input(gate: nn.Linear, x: torch.Tensor, eps: float) -> torch.Tensor:
    """What a router's projection reads of rows ``x`` [n, H]: ``x``, or with ``eps`` (Gemma
    4's) ``x`` RMS-normalised without a weight (in float32, back to its dtype), times the
    router's ``scale`` and H ** -0.5."""
    if not eps:
        return x
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
    return normed * cast(torch.Tensor, gate.scale) * x.shape[-1] ** -0.5


def expert_scaled(gate: nn.Linear, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The chosen experts' weights [n, k] times each one's ``per_expert_scale`` where the
    router has them (Gemma 4's), else as they are."""
    scale = getattr(gate, "per_expert_scale", None)
    return weights if scale is None else weights * scale[chosen].to(weights.dtype)


def route(router_logits: torch.Tensor, routing: Routing,
          bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts and their weights (``Routing``): ``router_logits`` [n, experts] ->
    (weights [n, k] in the logits' dtype, expert ids [n, k]). Qwen3-MoE's and Mixtral's: softmax
    over all experts in float32, the ``top_k`` largest, optionally renormalised."""
    scores = routing.scores(router_logits)
    if bias is None and routing.n_group == 1:
        # the top k's values are their scores: no gather (this runs every decode step)
        top, chosen = torch.topk(scores, routing.top_k, dim=-1)
        return routing.finish(top, router_logits.dtype), chosen
    chosen = routing.choose(scores, bias)
    return routing.weigh(scores, chosen, router_logits.dtype), chosen


def routing_dtype(num_experts: int) -> torch.dtype:
    """How recorded expert ids travel (``RoutingRecorder``, a sample's ``routing`` bytes): one
    byte each up to 256 experts, else two."""
    return torch.uint8 if num_experts <= 256 else torch.int16


def routing_from_bytes(data: bytes, cfg: ModelConfig) -> torch.Tensor:
    """Recorded routing bytes -> expert ids [positions, sparse layers, k] (int64)."""
    flat = torch.frombuffer(bytearray(data), dtype=routing_dtype(cfg.num_experts))
    return flat.view(-1, cfg.sparse_layers, cfg.num_experts_per_tok).long()


def replayed_route(
    router_logits: torch.Tensor, replay: torch.Tensor, routing: Routing,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` with the experts given: the rollout engine's choice (rollout routing replay,
    R3: Ma et al. 2025, arXiv:2510.11370), its weights from these logits as ``route`` weighs its
    own choice, so the router still learns. Rows of ``replay`` [n, k] holding -1 (positions the
    rollout did not route: the last token) take ``route``'s own choice."""
    scores = routing.scores(router_logits)
    own = routing.choose(scores, bias)
    given = replay[:, 0] >= 0
    experts = torch.where(given[:, None], replay, own) if bool(given.any()) else own
    return routing.weigh(scores, experts, router_logits.dtype), experts


def sort_by_expert(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """The n*k (token, choice) pairs of expert ids [n, k] in expert order, and how many each
    expert got: ``order`` indexes the flattened [n*k] choices (``order // k`` is a pair's token
    row), ``counts[e]`` pairs of expert e follow those of e - 1. One sort and one host sync,
    so each expert then reads a contiguous slice (no per-expert scan or gather)."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, torch.bincount(flat, minlength=num_experts).tolist()


def add_expert_outputs(
    into: torch.Tensor, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor,
    num_experts: int, expert: Callable[[int, torch.Tensor], torch.Tensor],
    scales_input: bool = False,
) -> torch.Tensor:
    """``into`` [n, H] plus, for each row of ``h`` [n, H], the outputs of its ``chosen``
    experts [n, k] weighed by ``weights`` [n, k], in place (``scales_input``, Llama 4's: each
    expert's input weighed instead, its output added as it is); ``expert(e, rows)`` runs
    expert ``e`` on rows [m, H]. Each expert hit runs once, on its contiguous slice of the
    expert-sorted rows (``sort_by_expert``). The trainer's ``SparseMoE`` and the engine's
    ``PackedExperts`` both combine their experts here."""
    order, counts = sort_by_expert(chosen, num_experts)
    rows = order // chosen.shape[-1]
    weight = weights.reshape(-1)[order, None]
    inputs, parts, start = h[rows], [], 0
    if scales_input:
        inputs = inputs * weight.to(inputs.dtype)
    for e, count in enumerate(counts):
        if count:
            parts.append(expert(e, inputs[start:start + count]))
            start += count
    outputs = torch.cat(parts)
    if not scales_input:
        outputs = outputs * weight
    return into.index_add_(0, rows, outputs.to(into.dtype))


class LoadBalance:
    """The Switch Transformer's load-balancing loss over one forward's sparse layers, as
    transformers' ``load_balancing_loss_func`` pools them (Qwen3-MoE's ``aux_loss``, what
    ``router_aux_loss_coef`` scales): ``E * sum_e f_e * P_e``, where over every sparse layer's
    valid tokens ``f_e`` is the mean number of a token's k choices that went to expert e and
    ``P_e`` the router's mean probability of e. Minimal (k) when routing is uniform. Only P
    carries a gradient: it pushes the router off the experts that get more than their share.

    Each sparse layer adds its router logits and the experts it dispatched to (with routing
    replay the rollout's, the load the layer really carried; without, the router's own top k,
    transformers' choice). ``valid`` [n] (1 a real token, 0 padding) weighs the rows."""

    def __init__(self, num_experts: int, valid: torch.Tensor | None = None) -> None:
        self.num_experts, self.valid = num_experts, valid
        self.chosen_sum: torch.Tensor | float = 0.0  # [E]: choices each expert got
        self.prob_sum: torch.Tensor | float = 0.0  # [E]: router probability (differentiable)
        self.rows: torch.Tensor | float = 0.0  # valid tokens summed over layers

    def add(self, router_logits: torch.Tensor, chosen: torch.Tensor,
            scoring: str = "softmax") -> None:
        """One sparse layer: ``router_logits`` [n, E], ``chosen`` expert ids [n, k]. A sigmoid
        router's P_e is its scores normalised to sum to 1 per token (DeepSeek-V3's balance
        loss, taken over the batch as this one is)."""
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        if scoring == "sigmoid":
            scores = torch.sigmoid(router_logits.float())
            probs = scores / scores.sum(-1, keepdim=True)
        weight = (torch.ones(probs.shape[0], device=probs.device) if self.valid is None
                  else self.valid.reshape(-1).to(probs.device, torch.float32))
        counts = torch.zeros(self.num_experts, device=probs.device).scatter_add_(
            0, chosen.reshape(-1), weight.repeat_interleave(chosen.shape[-1]))
        self.chosen_sum = self.chosen_sum + counts
        self.prob_sum = self.prob_sum + (probs * weight[:, None]).sum(0)
        self.rows = self.rows + weight.sum()

    def loss(self) -> torch.Tensor:
        """The loss (a scalar; 0 when no sparse layer ran)."""
        if isinstance(self.prob_sum, float):
            return torch.zeros(())
        rows = torch.clamp(torch.as_tensor(self.rows), min=1.0)
        return self.num_experts * ((self.chosen_sum / rows) * (self.prob_sum / rows)).sum()


class SparseMoE(nn.Module):
    """Qwen3-MoE's sparse block: a bias-free router ``gate`` over ``num_experts`` SwiGLU
    experts, each token through its ``num_experts_per_tok`` best, their outputs summed with the
    router's weights (``Routing``). Experts are modules of their own (``experts.3.up_proj``),
    as checkpoints name them: transformers 5 fuses them in memory but saves and loads these
    names. GLM-4.5's adds a sigmoid router's correction bias (``gate.e_score_correction_bias``:
    a statistic its pre-training balanced the load with, held as a frozen parameter, never
    trained: ``Decoder.requires_grad_``) and ``shared_experts``, an MLP every token goes
    through; Qwen2-MoE's a ``shared_expert`` every token goes through, scaled by a sigmoid of
    ``shared_expert_gate``.

    Every expert a token picks runs on a gathered batch of its tokens, so compute follows the
    routed tokens (k of E experts per token), not E; the router gets its gradient through the
    weights. The load-balancing loss is the trainer's to ask for (``router_aux_loss_coef``,
    0 by default: transformers adds it only with ``output_router_logits``, off in Qwen3-MoE's
    configs, and verl's FSDP trainer adds none): a ``LoadBalance`` passed in collects it."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.routing = Routing.of(cfg)
        # (gpt-oss's router has a bias: ``router.bias`` in its file)
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=cfg.architecture == "gpt_oss")
        if cfg.router_bias:  # (as the file names it: the router's own tensor)
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(cfg.num_experts), requires_grad=False)
        # Gemma 4's router: its input RMS-normalised, times a learned scale and
        # hidden_size ** -0.5; each chosen expert's weight times its learned per_expert_scale
        # (both trained, as transformers' parameters)
        self.router_norm_eps = cfg.rms_norm_eps if cfg.experts_beside_mlp else 0.0
        if self.router_norm_eps:
            self.gate.scale = nn.Parameter(torch.ones(cfg.hidden_size))
            self.gate.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))
        self.experts = nn.ModuleList(
            MLP(cfg, cfg.moe_intermediate_size, expert=True) for _ in range(cfg.num_experts)
        )
        # (GLM-4.5's and DeepSeek's n_shared_experts experts' width; Granite 4.0's its own)
        self.shared_experts = MLP(cfg, cfg.shared_width) if cfg.shared_width else None
        # Qwen2-MoE's shared expert, scaled by sigmoid(shared_expert_gate(x)) (its names)
        self.shared_expert = self.shared_expert_gate = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(cfg, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    @property
    def correction_bias(self) -> torch.Tensor | None:
        return getattr(self.gate, "e_score_correction_bias", None)

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None = None,
                balance: LoadBalance | None = None,
                route_from: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [..., H]; ``replay`` [..., k]: experts to use instead of the router's top k
        (``replayed_route``); ``balance`` collects this layer's load-balancing terms;
        ``route_from`` [..., H]: what the router reads, where it is not ``x`` (Gemma 4's)."""
        flat = x.reshape(-1, x.shape[-1])
        routed = flat if route_from is None else route_from.reshape(flat.shape)
        logits = router_logits(self.gate, router_input(self.gate, routed, self.router_norm_eps),
                               self.routing)
        if replay is None:
            weights, chosen = route(logits, self.routing, self.correction_bias)
        else:
            weights, chosen = replayed_route(logits, replay.reshape(-1, self.routing.top_k),
                                             self.routing, self.correction_bias)
        weights = expert_scaled(self.gate, weights, chosen)
        if balance is not None:
            balance.add(logits, chosen, self.routing.scoring)
        out = torch.zeros_like(flat) if self.shared_experts is None else self.shared_experts(flat)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        out = add_expert_outputs(out, flat, weights, chosen, len(self.experts),
                                 lambda e, rows: self.experts[e](rows),
                                 self.routing.scales_input)
        return out.view_as(x)
