"""From option logits to probabilities: pure numpy, no engine."""

from __future__ import annotations

import numpy as np


def logsumexp(values: np.ndarray) -> float:
    top = float(np.max(values))
    return top + float(np.log(np.sum(np.exp(values.astype(np.float64) - top))))


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    scaled = logits.astype(np.float64) / temperature
    scaled -= scaled.max()
    weights = np.exp(scaled)
    return weights / weights.sum()


def allowed_token_mass(option_logits: np.ndarray, vocab_logsumexp: float) -> float:
    """Share of the model's full next-token distribution that falls on the option letters."""
    return float(np.exp(min(0.0, logsumexp(option_logits) - vocab_logsumexp)))


def confidence(probabilities: np.ndarray) -> float:
    """(n * p_max - 1) / (n - 1): 0 for a uniform answer, 1 for a certain one."""
    n = len(probabilities)
    return float((n * probabilities.max() - 1.0) / (n - 1)) if n > 1 else 1.0
