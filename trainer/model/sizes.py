"""What a config's numbers come to, from the config alone: parameters, training FLOPs per token, a
MoE layer's receive buffer. Flax-free: a resumed trainer that loads its train step without
tracing never imports the model's libraries (trainer/state/compile_cache.py)."""

from __future__ import annotations

from trainer.config import Config, layer_windows


def buffer_rows(local_tokens: int, top_k: int, factor: float, ep: int, num_experts: int) -> int:
    """Receive-buffer rows per expert shard: ``int(local_tokens * top_k * factor)``.

    ``factor <= 0`` means dropless: the worst case ``local_tokens * top_k * min(EP, E / top_k)``
    (every source sends all its rows for this shard's experts). Larger factors are capped there too,
    as rows past the worst case can never be used.

    A factor that drops rows makes the result depend on the expert-parallel layout: *which* rows drop
    depends on how tokens are split into shards. Exactness across shapes (the cross-shape resume
    test) therefore needs a dropless factor (or one that happens not to drop).
    """
    worst = int(local_tokens * top_k * min(ep, num_experts / top_k))
    if factor <= 0:
        return max(worst, 1)
    return max(1, min(int(local_tokens * top_k * factor), worst))


def param_counts(cfg: Config) -> tuple[int, int]:
    """(total, active per token) parameters, from the config alone."""
    m, e = cfg.model, cfg.moe
    kv = m.kv_heads or m.n_heads
    attn = 2 * m.d_model * (m.n_heads + kv) * m.head_dim  # q and o; k and v (grouped)
    norms = 2 * m.d_model + (m.n_heads + kv) * m.head_dim * m.qk_norm
    dense_ffn = 3 * m.d_model * m.d_ff
    shared = 3 * m.d_model * e.shared_expert_dim
    expert = 3 * m.d_model * e.d_expert
    router = m.d_model * e.num_experts
    n_moe = m.n_layers - m.dense_layers
    base = 2 * m.vocab_size * m.d_model + m.d_model + m.n_layers * (attn + norms) + m.dense_layers * dense_ffn
    total = base + n_moe * (router + shared + e.num_experts * expert)
    active = base + n_moe * (router + shared + e.top_k * expert)
    return total, active


def flops_per_token(cfg: Config) -> float:
    """Training FLOPs per token: 6 × matmul parameters used per token + causal attention.

    Matmul parameters exclude the embedding lookup; attention scores and values add
    ``12 · heads · head_dim`` per key a query sees, summed over the layers: ``seq_len / 2`` keys
    (causal: half the score matrix), as in MaxText; a layer with a window W < seq_len sees
    ``W - W² / (2 · seq_len)`` (the band of the causal triangle it keeps).
    """
    m = cfg.model
    _, active = param_counts(cfg)
    norms = 2 * m.d_model + ((m.kv_heads or m.n_heads) + m.n_heads) * m.head_dim * m.qk_norm
    matmul = active - m.vocab_size * m.d_model - m.d_model - m.n_layers * norms
    t = m.seq_len
    # Document masks are not counted: the causal upper bound, as MaxText counts it.
    keys = sum(w - w * w / (2 * t) if 0 < w < t else t / 2 for w in layer_windows(m))
    attention = 12 * m.n_heads * m.head_dim * keys
    return 6.0 * matmul + attention
