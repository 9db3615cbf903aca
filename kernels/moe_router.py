"""DeepSeek's routers in torch (fp32), as transformers computes them.

    softmax scoring (DeepSeek-V2):   scores = softmax(logits)
        topk_method "greedy":                top-k of all experts
        topk_method "group_limited_greedy":  experts split into n_group groups; the topk_group
                                             groups with the highest single score stay, top-k
                                             among their experts
    sigmoid scoring (DeepSeek-V3, topk_method "noaux_tc"):
        choice = sigmoid(logits) + e_score_correction_bias; a group's score is the sum of its
        two best choices; top-k of choice among the topk_group best groups; the weights are
        the uncorrected sigmoid scores of the chosen experts
    softmax scoring with the correction bias (ERNIE 4.5, "softmax_bias"): the same choice over
        softmax(logits) without groups, the weights the chosen softmax scores / max(their sum,
        moe_norm_min)

Then weights / (sum + 1e-20) when norm_topk_prob (sigmoid scoring only, as transformers does),
times routed_scaling_factor. Expert ids come back ascending per token (transformers' order is
unsorted; the sum over experts does not depend on it).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupedRouting:
    top_k: int
    num_groups: int = 1
    topk_groups: int = 1
    method: str = "greedy"  # "greedy", "group_limited_greedy", "noaux_tc" or "softmax_bias"
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    norm_min: float = 1e-12  # "softmax_bias": the least sum the chosen scores are divided by

    @property
    def has_correction_bias(self) -> bool:
        return self.method in ("noaux_tc", "softmax_bias")

    def __post_init__(self) -> None:
        if self.method not in ("greedy", "group_limited_greedy", "noaux_tc", "softmax_bias"):
            raise ValueError(
                f"config.json: topk_method {self.method!r} is not supported; expected greedy, "
                "group_limited_greedy or noaux_tc"
            )
        if not 0 < self.topk_groups <= self.num_groups:
            raise ValueError(
                f"config.json: topk_group ({self.topk_groups}) must be in 1..n_group "
                f"({self.num_groups})"
            )


def _group_mask(choice: torch.Tensor, routing: GroupedRouting, group_score: str) -> torch.Tensor:
    """[T, E] bool: the experts of each token's topk_groups best groups."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, routing.num_groups, experts // routing.num_groups)
    if group_score == "max":
        scores = grouped.max(dim=-1).values
    else:  # sum of the two best
        scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best = torch.topk(scores, routing.topk_groups, dim=-1).indices
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, best, True)
    return keep.unsqueeze(-1).expand_as(grouped).reshape(tokens, experts)


def route_grouped(
    router_logits: torch.Tensor,
    routing: GroupedRouting,
    correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, expert ids [T, k] int64, ascending) for fp32 logits [T, E]."""
    logits = router_logits.float()
    if routing.method == "noaux_tc":
        scores = logits.sigmoid()
        choice = scores if correction_bias is None else scores + correction_bias
        choice = choice.masked_fill(~_group_mask(choice, routing, "top2"), float("-inf"))
        ids = torch.topk(choice, routing.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if routing.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    elif routing.method == "softmax_bias":
        scores = logits.softmax(dim=-1)
        choice = scores if correction_bias is None else scores + correction_bias
        ids = torch.topk(choice, routing.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=routing.norm_min)
    else:
        scores = logits.softmax(dim=-1)
        if routing.method == "group_limited_greedy":
            scores = scores.masked_fill(~_group_mask(scores, routing, "max"), 0.0)
        weights, ids = torch.topk(scores, routing.top_k, dim=-1)
    ids, order = ids.sort(dim=-1)
    weights = weights.gather(1, order) * routing.routed_scaling_factor
    return weights, ids
