"""What calls carry: examples (Datum), optimizer and sampling parameters, and results."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .errors import InvalidRequest

# Optional per-token arrays an example may carry besides tokens/targets/weights.
_OPTIONAL = ("positions", "logprobs", "advantages")
_INT_ARRAYS = ("tokens", "targets", "positions")


@dataclass
class Datum:
    """One training example: every array has one entry per position.

    tokens[i] is the input at position i, targets[i] the token position i should predict (for
    next-token training, tokens shifted by one), weights[i] how much that prediction counts (0:
    not at all). positions (packed rows), logprobs (the sampler's, for importance_sampling and
    ppo) and advantages (per token) are optional."""

    tokens: List[int]
    targets: List[int]
    weights: List[float]
    positions: Optional[List[int]] = None
    logprobs: Optional[List[float]] = None
    advantages: Optional[List[float]] = None

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"tokens": list(self.tokens), "targets": list(self.targets),
                             "weights": [float(w) for w in self.weights]}
        for k in _OPTIONAL:
            v = getattr(self, k)
            if v is not None:
                d[k] = list(v) if k == "positions" else [float(x) for x in v]
        return d


DatumLike = Union[Datum, Mapping[str, Any]]


def datum_json(d: DatumLike, index: int = 0) -> Dict[str, Any]:
    """The wire form of one example, checked the way the server checks shapes so that a mistake
    is reported before it is queued: InvalidRequest names the field, e.g. data[3].weights."""
    obj = d.to_json() if isinstance(d, Datum) else dict(d)
    where = f"data[{index}]"
    for k in ("tokens", "targets", "weights"):
        if k not in obj:
            raise InvalidRequest(f"{where} has no {k}", field=f"{where}.{k}", code="invalid")
    n = len(obj["tokens"])
    if n == 0:
        raise InvalidRequest(f"{where}.tokens is empty", field=f"{where}.tokens", code="invalid")
    for k, v in obj.items():
        if k not in ("tokens", "targets", "weights") + _OPTIONAL:
            continue  # passed through: the server decides
        if not isinstance(v, (list, tuple)) or len(v) != n:
            raise InvalidRequest(f"{where}.{k} must be a list as long as tokens ({n})",
                                 field=f"{where}.{k}", code="invalid")
        for i, x in enumerate(v):
            if k in _INT_ARRAYS:
                if isinstance(x, bool) or not isinstance(x, int):
                    raise InvalidRequest(f"{where}.{k}[{i}] must be an integer", field=f"{where}.{k}",
                                         code="invalid")
            elif isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise InvalidRequest(f"{where}.{k}[{i}] must be a finite number", field=f"{where}.{k}",
                                     code="invalid")
    return obj


def sft_datum(prompt_tokens: Sequence[int], completion_tokens: Sequence[int],
              eos: Optional[int] = None) -> Datum:
    """A supervised example: the model learns the completion (and eos, when given) after the
    prompt. tokens = sequence[:-1], targets = sequence[1:]; a prediction counts (weight 1) when
    its target is part of the completion, not when it is part of the prompt."""
    if not prompt_tokens:
        raise ValueError("sft_datum: the prompt needs at least one token")
    completion = list(completion_tokens) + ([eos] if eos is not None else [])
    if not completion:
        raise ValueError("sft_datum: nothing to learn (empty completion and no eos)")
    seq = list(prompt_tokens) + completion
    weights = [0.0] * (len(prompt_tokens) - 1) + [1.0] * len(completion)
    return Datum(tokens=seq[:-1], targets=seq[1:], weights=weights)


def rl_datum(prompt_tokens: Sequence[int], sampled_tokens: Sequence[int], sampled_logprobs: Sequence[float],
             advantage: float) -> Datum:
    """A policy-gradient example for importance_sampling or ppo: the sampled tokens are the
    targets after the prompt, each with the sampler's logprob and the same advantage; the
    prompt's positions have weight, logprob and advantage 0."""
    if not prompt_tokens or not sampled_tokens:
        raise ValueError("rl_datum: the prompt and the sample need at least one token each")
    if len(sampled_logprobs) != len(sampled_tokens):
        raise ValueError("rl_datum: one logprob per sampled token")
    seq = list(prompt_tokens) + list(sampled_tokens)
    p = len(prompt_tokens) - 1
    k = len(sampled_tokens)
    return Datum(tokens=seq[:-1], targets=seq[1:], weights=[0.0] * p + [1.0] * k,
                 logprobs=[0.0] * p + [float(x) for x in sampled_logprobs],
                 advantages=[0.0] * p + [float(advantage)] * k)


@dataclass
class AdamParams:
    """AdamW for optim_step. grad_clip 0: no clipping."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 0.0

    def to_json(self) -> Dict[str, float]:
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                "weight_decay": self.weight_decay, "grad_clip": self.grad_clip}


@dataclass
class SamplingParams:
    """For sample: temperature 0 is greedy; stop is a list of token ids that end a sample."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: List[int] = field(default_factory=list)
    seed: int = 0

    def to_json(self) -> Dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "stop": list(self.stop), "seed": self.seed}


@dataclass
class ForwardBackwardOutput:
    """forward_backward / forward: the loss, each example's per-token logprobs (its own length)
    and the number of tokens with weight > 0."""

    loss: float
    logprobs: List[List[float]]
    tokens: int
    raw: Dict[str, Any]


@dataclass
class OptimStepOutput:
    step: int
    grad_norm: Optional[float]
    raw: Dict[str, Any]


@dataclass
class SavedState:
    """save_state / load_state: the name and the optimizer step of the state."""

    name: str
    step: int
    raw: Dict[str, Any]


@dataclass
class Sample:
    """One sample: the index of its prompt, the generated tokens and their logprobs."""

    prompt: int
    tokens: List[int]
    logprobs: List[float]


@dataclass
class SampleOutput:
    """num_samples per prompt, prompt-major: samples[i * num_samples + j]."""

    samples: List[Sample]
    raw: Dict[str, Any]

    def for_prompt(self, i: int) -> List[Sample]:
        return [s for s in self.samples if s.prompt == i]
