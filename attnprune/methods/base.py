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

The protocol: :class:`TokenMethod` declares every attribute a host reads from a token method,
with its default (a method sets only what differs); :class:`AttentionMethod` and
:class:`LossMethod` do the same for the attention host. ``registry.register`` refuses a
class that does not derive from its kind's base, so a new method is one file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    """Base class of token-pruning methods (kind "token"): the attributes hosts read, with
    their defaults; subclasses set those that differ and implement :meth:`forward`.

    Read by every token host (``hf_encoder``, the synthetic track's): ``needs_attention``,
    ``attention_rows``, ``needs_keys``, ``needs_labels``, ``variable_budget``,
    ``default_reduce``. Read by the causal hosts (``hf_causal``, ``hf_llama``), which take
    only methods with ``causal = True``: ``layers``, ``protect_last``, :meth:`reinforce_loss`.
    """

    needs_attention: bool = False
    """True: :meth:`forward` scores from the layer's attention probabilities (``attn``)."""
    attention_rows: str = "all"
    """Which rows of the attention probabilities the score reads, so hosts compute only those:
    "all" (B, H, L, L), "first" (the CLS row, (B, H, 1, L)) or "received" (per head, the mean
    over real queries, (B, H, 1, L)). Hosts that ignore it pass the full (B, H, L, L)."""
    needs_keys: bool = False
    """True: :meth:`forward` takes ``keys`` (B, L, d_k), the layer's key projection."""
    needs_labels: bool = False
    """True: a training loss of the method reads the sequence labels (``labels``)."""
    variable_budget: bool = False
    """True: the kept count is not ⌊ρ·n⌋ (thresholds, policies): hosts size gathers from it."""
    default_reduce: str = "drop"
    """What a host that can merge does with the unkept tokens ("drop" or "merge")."""
    causal: bool = False
    """True: the decision for token t reads only tokens ≤ t and not the sequence length, so a
    cached decode step decides as a full recompute (the causal hosts refuse other methods)."""
    layers: tuple[int, ...] = ()
    """The decision layers a causal host runs the method at (causal methods set their own)."""
    protect_last: int = 0
    """In training, the causal hosts keep the chunk's last N positions whatever the scores."""

    def reinforce_loss(self, actions: list[dict], token_loss: Tensor, real: Tensor) -> Tensor | None:
        """The policy loss of a forward's ``actions`` (the ``Selection.info`` dicts that hold a
        ``log_prob``, with their original positions), given the per-position LM losses
        ``token_loss`` (B, T) and the positions whose decisions count ``real`` (B, T); None
        for a method without a policy. The causal hosts call it when labels are given."""
        return None

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


class AttentionMethod(nn.Module):
    """Base class of attention-level methods (kind "attention"): the attention host runs
    :meth:`attend` in place of the attention function of every self-attention module.

    ``neutral_options`` and ``example_options`` are facts of the method that tests and docs
    read from the registry (no hand-written list per method): the options under which it
    leaves the model's outputs stock, and options under which a short run visibly acts.
    """

    needs_hidden: bool = False
    """True: the host captures each layer's input hidden states and passes them (``hidden``)."""
    ffn_on: bool = False
    """True: the host hooks every FFN's first layer and adds :meth:`ffn_term` to the losses."""
    neutral_options: ClassVar[dict] = {}
    """Options under which the method leaves the model's outputs stock."""
    example_options: ClassVar[dict] = {}
    """Options under which a short run visibly acts (the defaults when empty)."""

    def attend(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
               mask: Tensor | None, **kwargs) -> tuple[Tensor, Tensor | None]:
        """Attention of ``module`` on ``query`` (B, H, Tq, d), ``key`` / ``value`` (B, H, Tk, d)
        under ``mask``; returns (out (B, Tq, H, d), probabilities or None). Keywords: dropout,
        scaling, layer, hidden, aux (the call's loss list), token_mask, need_weights, softcap,
        bias, positions."""
        raise NotImplementedError

    def ffn_term(self, pre_activation: Tensor, token_mask: Tensor | None) -> Tensor:
        """The loss term of one FFN first layer's output (only when ``ffn_on``)."""
        raise NotImplementedError


class LossMethod(AttentionMethod):
    """Base class of loss methods (kind "loss"): served by the attention host like an
    attention method, they leave the attention as it is and add penalties to the call's
    losses (``aux``, :meth:`ffn_term`)."""


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
