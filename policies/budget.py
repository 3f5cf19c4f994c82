"""A step's shrinking budgets: batched tokens and running sequences."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepBudget:
    num_tokens: int
    num_seqs: int

    def take(self, num_tokens: int) -> None:
        self.num_tokens -= num_tokens
        self.num_seqs -= 1

    @property
    def is_spent(self) -> bool:
        return self.num_tokens <= 0 or self.num_seqs <= 0
