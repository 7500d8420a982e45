"""The contract between token-pruning methods and the hosts that wire them into models.

A token method looks at the hidden states X⁽ˡ⁾ (B, L, d) after a layer (and, if it asks for
them, that layer's attention probabilities A (B, H, L, L)) and returns a :class:`Selection`:
which tokens survive. The host removes the others from the tensor (gather) before the next
layer. Methods never import a host and never know which HF class they run in.

Training-time relaxations (a soft mask m̃ in [0, 1]) are returned in ``Selection.soft``; a host
in training mode multiplies the hidden states by it instead of gathering, so gradients reach
the gate. Auxiliary losses (budget, sparsity, per-token head losses) are returned in
``Selection.aux_loss``; hosts add them up and expose the sum through
``attnprune.aux_loss(model)``, which training loops add to the task loss.

Hosts that merge (the encoder host with ``reduce="merge"``) do not delete the unkept tokens:
each is averaged, weighted by how many originals it stands for, into the kept token the
method names in ``Selection.merge_into`` or else its most similar kept one, so the method's
``keep`` says which tokens stay computed, not whose content survives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class Selection:
    keep: Tensor  # (B, L) bool: hard decision; padding is always False
    soft: Tensor | None = None  # (B, L) float in [0, 1]: relaxed mask used in training, or None
    scores: Tensor | None = None  # (B, L) importance scores, higher = keep (for analysis)
    aux_loss: Tensor | None = None  # scalar added to the task loss, or None
    info: dict | None = None  # extra per-token tensors for analysis (e.g. entropy, probs)
    # (B, L) long, for hosts that merge (``reduce="merge"``): the slot each dropped token is
    # averaged into (ToMe's bipartite match). None: the host merges each dropped token into
    # its most similar kept one (cosine of keys); a slot that is not kept falls back to that.
    merge_into: Tensor | None = None


class TokenMethod(nn.Module):
    """Base class of token-pruning methods (kind "token").

    Subclasses set ``needs_attention`` when they score from attention probabilities and
    ``needs_labels`` when a training loss of theirs uses the sequence labels, and
    ``variable_budget`` when they decide the kept count themselves (thresholds); they implement
    :meth:`forward`. ``protect_first`` keeps position 0 (CLS) whatever its score.
    """

    needs_attention: bool = False
    needs_labels: bool = False
    variable_budget: bool = False  # True: the kept count is not ⌊ρ·n⌋ (thresholds, policies)
    needs_keys: bool = False  # True: forward takes ``keys`` (B, L, d_k), the layer's key projection
    default_reduce: str = "drop"  # what a host that can merge does with the unkept tokens

    def forward(
        self,
        hidden: Tensor,  # (B, L, d)
        mask: Tensor,  # (B, L) bool, True = real token
        attn: Tensor | None = None,  # (B, H, L, L) attention probabilities of the last layer
        keep_ratio: float = 0.5,
        layer: int = 0,
        labels: Tensor | None = None,  # (B,) sequence labels, in training only
        protect: Tensor | None = None,  # (B, L) bool, tokens that must be kept (e.g. CLS)
    ) -> Selection:
        raise NotImplementedError


def protect_first(mask: Tensor) -> Tensor:
    """(B, L) bool marking position 0 of every row (the CLS token)."""
    p = torch.zeros_like(mask, dtype=torch.bool)
    p[:, 0] = True
    return p & mask.bool()


def protect_special(mask: Tensor, input_ids: Tensor | None = None,
                    token_type_ids: Tensor | None = None, special_ids=()) -> Tensor:
    """(B, L) bool marking the tokens a pruner must keep: CLS (position 0) and every separator.

    A separator ([SEP], ``</s>``) marks where a text ends; dropping it merges a sentence pair
    into one run of words, which the model never saw in pre-training. Separators are found
    three ways, so no tokenizer is needed when the inputs tell: the last real token of each row
    (every BERT / RoBERTa / DistilBERT input ends with one), the last token of each
    ``token_type_ids`` segment (BERT's first [SEP] of a pair), and any token whose id is in
    ``special_ids`` (a RoBERTa pair's ``</s></s>`` or DistilBERT's middle [SEP], which have no
    segment ids). ``mask`` (B, L) marks real tokens; padding is never protected.
    """
    mask = mask.bool()
    p = protect_first(mask)
    B, L = mask.shape
    pos = torch.arange(L, device=mask.device).expand(B, L)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(1).values  # (B,) −1: empty row
    p |= (pos == last[:, None]) & mask
    if token_type_ids is not None and token_type_ids.shape == mask.shape and L > 1:
        ends = torch.zeros_like(mask)
        ends[:, :-1] = token_type_ids[:, :-1] != token_type_ids[:, 1:]
        p |= ends & mask
    if input_ids is not None and input_ids.shape == mask.shape and len(special_ids):
        # A tensor already on the device (hosts cache one) avoids a host → device copy per
        # call, which waits for the device. == / any rather than torch.isin: isin lowers to
        # aten.searchsorted, which has no ONNX function (a CLI-trained model failed to export).
        ids = special_ids if isinstance(special_ids, torch.Tensor) else torch.as_tensor(
            list(special_ids), device=input_ids.device)
        ids = ids.to(device=input_ids.device, dtype=input_ids.dtype)
        p |= (input_ids[..., None] == ids).any(-1) & mask
    return p
