"""Model facts read from a model folder's ``config.json``: family, MoE or dense, heads, position limit, size.

Hugging Face configs name the same fact differently per family; each fact lists the keys it is read from, in
order, so a new family usually needs a key added here rather than code elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runctl.safefiles import read_regular

_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class ModelFacts:
    """What the checks need to know about a model."""

    path: str
    family: str
    num_attention_heads: int | None
    num_key_value_heads: int | None
    max_position_embeddings: int | None
    hidden_size: int | None
    num_layers: int | None
    head_dim: int | None
    num_experts: int
    rope_scaling: bool
    num_params: int | None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1


class FactsUnavailable(Exception):
    """The model folder has no readable config.json; ``reason`` says why (shown as a skip reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _int(doc: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _text_config(doc: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs keep the language model's facts under text_config.
    inner = doc.get("text_config")
    return {**doc, **inner} if isinstance(inner, dict) else doc


def estimate_params(doc: dict[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer from its shape (embeddings, attention, MLP or experts)."""
    hidden = _int(doc, "hidden_size", "n_embd", "d_model")
    layers = _int(doc, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _int(doc, "vocab_size")
    if hidden is None or layers is None or vocab is None:
        return None
    heads = _int(doc, "num_attention_heads", "n_head") or 1
    kv_heads = _int(doc, "num_key_value_heads") or heads
    head_dim = _int(doc, "head_dim") or hidden // heads
    attention = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    intermediate = _int(doc, "moe_intermediate_size", "intermediate_size", "n_inner") or 4 * hidden
    experts = max(1, _int(doc, *_EXPERT_KEYS) or 1)
    mlp = 3 * hidden * intermediate * experts
    embeddings = vocab * hidden * (1 if doc.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp) + embeddings


def _head_dim(doc: dict[str, Any]) -> int | None:
    hidden, heads = _int(doc, "hidden_size", "n_embd", "d_model"), _int(doc, "num_attention_heads", "n_head")
    return _int(doc, "head_dim") or (hidden // heads if hidden and heads else None)


def kv_bytes_per_token(facts: ModelFacts, tp: int, dtype_bytes: int = 2) -> int | None:
    """KV-cache bytes one token takes on one GPU: K and V for every layer, this GPU's share of the KV heads.

    With TP larger than the KV-head count, vLLM replicates heads, so each GPU holds at least one.
    """
    if facts.num_layers is None or facts.num_key_value_heads is None or facts.head_dim is None:
        return None
    heads_here = max(1, facts.num_key_value_heads // tp)
    return 2 * facts.num_layers * heads_here * facts.head_dim * dtype_bytes


def read_facts(model_path: str) -> ModelFacts:
    """Read a model folder's facts.

    Raises:
        FactsUnavailable: no folder, no config.json, or config.json is not JSON.
    """
    folder = Path(model_path)
    config = folder / "config.json"
    if not folder.is_dir():
        raise FactsUnavailable(f"MODEL_PATH {model_path} is not a folder on this machine")
    try:
        doc = _text_config(json.loads(read_regular(config, what="config.json")))
    except FileNotFoundError as e:
        raise FactsUnavailable(f"{config} does not exist") from e
    except (OSError, ValueError) as e:
        raise FactsUnavailable(f"{config} is not readable JSON ({e})") from e
    family = str(doc.get("model_type") or "unknown")
    return ModelFacts(
        path=model_path,
        family=family,
        num_attention_heads=_int(doc, "num_attention_heads", "n_head"),
        num_key_value_heads=_int(doc, "num_key_value_heads", "num_attention_heads", "n_head"),
        max_position_embeddings=_int(doc, *_POSITION_KEYS),
        hidden_size=_int(doc, "hidden_size", "n_embd", "d_model"),
        num_layers=_int(doc, "num_hidden_layers", "n_layer", "num_layers"),
        head_dim=_head_dim(doc),
        num_experts=_int(doc, *_EXPERT_KEYS) or 1,
        rope_scaling=bool(doc.get("rope_scaling")),
        num_params=estimate_params(doc),
    )
