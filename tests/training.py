"""A real short training run that the coders' tests measure: a small GPT-2 and its AdamW."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: Makes one batch of token ids from the run's token generator.
Batches = Callable[[torch.Generator], torch.Tensor]


def tokens_below(vocabulary: int) -> Batches:
    """Batches of 8 × 64 tokens drawn from the first ``vocabulary`` of the model's 2048."""
    return lambda tokens: torch.randint(0, vocabulary, (8, 64), generator=tokens)


def repeated_quarter(tokens: torch.Generator) -> torch.Tensor:
    """Batches of 16 tokens from the first quarter of the vocabulary, each repeated four
    times: the embedding rows of the tokens never seen move together."""
    return torch.cat([torch.randint(0, 512, (8, 16), generator=tokens)] * 4, dim=1)


def short_run(batches: Batches, weight_decay: float = 0.01) -> tuple[Any, torch.optim.AdamW]:
    """A small GPT-2 (seeded) after 30 AdamW steps on ``batches``, and its optimizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=128))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=weight_decay)
    tokens = torch.Generator().manual_seed(1)
    for _ in range(30):
        text = batches(tokens)
        model(text, labels=text).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def moments(model: Any, optimizer: torch.optim.AdamW, kind: str) -> dict[str, torch.Tensor]:
    """The optimizer's ``kind`` (``exp_avg`` or ``exp_avg_sq``) by parameter name."""
    names = {p: n for n, p in model.named_parameters()}
    return {names[p]: s[kind].contiguous() for p, s in optimizer.state.items()}
