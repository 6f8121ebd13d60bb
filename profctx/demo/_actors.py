"""The demo's Ray actors: training workers (a small MLP policy) and rollout workers (token sampling).

Importable on purpose: Ray workers load these classes by reference. Every method that does work
is ``@profiled``; the driver adds nothing per call, the scope and config travel with the call.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from torch import nn

import profctx

VOCAB = 64
WIDTH = 48


class Policy(nn.Module):  # type: ignore[misc]
    """A next-token model: embedding of the last two tokens, then an MLP to logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(2 * WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, VOCAB))

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Return next-token logits for ``context`` (batch, 2) token ids."""
        return self.mlp(self.embed(context).flatten(1))  # type: ignore[no-any-return]


def _pairs(sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (context of two tokens, next token) for every position of every sequence."""
    context = torch.stack([sequences[:, :-2], sequences[:, 1:-1]], dim=-1).reshape(-1, 2)
    return context, sequences[:, 2:].reshape(-1)


@ray.remote(num_cpus=0)
class Rollout:
    """Samples token sequences autoregressively from a tiny policy (role ``rollout``)."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.policy = Policy()

    @profctx.profiled(role="rollout")
    def generate(self, prompts: int, new_tokens: int) -> list[list[int]]:
        """Return ``prompts`` sequences of 2 random prompt tokens plus ``new_tokens`` sampled ones."""
        with torch.no_grad():
            tokens = torch.randint(0, VOCAB, (prompts, 2))
            for _ in range(new_tokens):
                logits = self.policy(tokens[:, -2:])
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1)
                tokens = torch.cat([tokens, nxt], dim=1)
        return tokens.tolist()  # type: ignore[no-any-return]


@ray.remote(num_cpus=0)
class Trainer:
    """One data-parallel training worker: reference log-probs, then a clipped policy update."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.policy = Policy()
        self.reference = Policy()
        self.reference.load_state_dict(self.policy.state_dict())
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=3e-3)

    @profctx.profiled(role="ref_compute_log_prob")
    def ref_log_prob(self, sequences: list[list[int]]) -> list[float]:
        """Return the reference policy's log-probability of every sampled token."""
        context, target = _pairs(torch.tensor(sequences))
        with torch.no_grad():
            logp = torch.log_softmax(self.reference(context), dim=-1)
        return logp.gather(1, target[:, None]).squeeze(1).tolist()  # type: ignore[no-any-return]

    @profctx.profiled(role="actor_update")
    def update(self, sequences: list[list[int]], ref_logp: list[float], epochs: int = 2) -> dict[str, Any]:
        """Run a few PPO-style epochs (reward: token parity; KL to the reference); return the last loss."""
        context, target = _pairs(torch.tensor(sequences))
        reference = torch.tensor(ref_logp)
        reward = (target % 2 == 0).float() - 0.5
        with torch.no_grad():
            old = torch.log_softmax(self.policy(context), dim=-1).gather(1, target[:, None]).squeeze(1)
        loss = torch.zeros(())
        for _ in range(epochs):
            logp = torch.log_softmax(self.policy(context), dim=-1).gather(1, target[:, None]).squeeze(1)
            ratio = torch.exp(logp - old)
            clipped = torch.clamp(ratio, 0.8, 1.2)
            loss = -torch.min(ratio * reward, clipped * reward).mean() + 0.05 * (logp - reference).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return {"loss": float(loss), "reward": float(reward.mean())}
