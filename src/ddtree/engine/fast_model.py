"""The engine's own model code: a dense decoder (Qwen3 / Qwen2 / Llama layout) and the DFlash drafter over
static, slot-indexed KV caches, written so that one decoding round can be replayed from CUDA graphs.

Why not the Hugging Face modules: their caches grow by concatenation, write one position range shared by
the batch and take a 4D mask per call, and their forward launches separate q/k/v and gate/up projections.
Here every request owns a cache slot of a fixed capacity, each token writes the cache row given in `rows`
(so tree nodes of different requests land at different offsets), what a token sees is a `Visibility`
(a context prefix plus a mask over the forward's own tokens), and q/k/v and gate/up are one matmul each.
Shapes never depend on data, so the same code runs eagerly on the CPU and under CUDA-graph capture on a GPU.

Attention has two backends, chosen once per model at construction: `triton`
(`ddtree.engine.triton_attention`, CUDA: reads only the visible rows, split over the key range) and `sdpa`
(the pure-torch reference that runs everywhere: the visibility as an additive bias over the whole slot).

Shape letters: B batch rows (the first B cache slots), T tokens per row, S cache capacity (rows per slot),
L layers, H hidden size, h / h_kv query / key-value heads, d head dim, g = h / h_kv, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED_FAMILIES = ("qwen3", "qwen2", "llama")


@dataclass(frozen=True)
class DecoderShape:
    """Architecture of a dense decoder (what the weights and the caches are sized by)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    qk_norm: bool  # Qwen3: RMSNorm on every q / k head before RoPE
    qkv_bias: bool  # Qwen2: biases on q, k, v
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960

    @property
    def groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def family_of(config) -> str | None:
    """The supported family of a transformers config, or None (then the engine uses the Hugging Face path)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    family = getattr(text, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        return None
    rope = getattr(text, "rope_scaling", None) or {}
    params = getattr(text, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type")) or params.get("rope_type", "default")
    if rope_type not in (None, "default"):
        return None  # scaled RoPE variants are not implemented here
    if getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None):
        return None
    return family


def shape_of(config) -> DecoderShape:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    theta = getattr(text, "rope_theta", None)
    if theta is None:
        theta = (getattr(text, "rope_parameters", None) or {}).get("rope_theta", 10_000.0)
    return DecoderShape(
        num_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        intermediate_size=int(text.intermediate_size),
        num_heads=heads,
        num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
        vocab_size=int(text.vocab_size),
        qk_norm=text.model_type == "qwen3",
        qkv_bias=bool(getattr(text, "attention_bias", False)) or text.model_type == "qwen2",
        rms_norm_eps=float(text.rms_norm_eps),
        rope_theta=float(theta),
        max_position_embeddings=int(text.max_position_embeddings),
    )


# ---- shared pieces -----------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3/Llama RMSNorm: normalise in fp32, cast back, then scale (same rounding as the HF modules)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """[d / 2] fp32 RoPE frequencies, computed as Hugging Face computes them."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T], inv_freq [d / 2] (`rope_inv_freq`, computed once per model) -> cos, sin [B, T, 1, d]
    (halves layout, computed in fp32 like HF)."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [B, T, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, d]
    return emb.cos().to(dtype).unsqueeze(2), emb.sin().to(dtype).unsqueeze(2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, d] rotated by cos/sin [B, T, 1, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


@dataclass
class Visibility:
    """What the T tokens of one forward attend to, per batch row b: the context rows [0, context_len[b]) of
    the slot, and their own tokens, whose K/V this forward writes to rows own_start[b] + 0 .. T-1, through
    own_mask (token i sees own token j; every token sees itself). Prefill: no context, causal own mask;
    tree verify: the committed rows, ancestor-only mask; drafter block: the committed context, all-ones."""

    context_len: torch.Tensor  # [B] int64
    own_start: torch.Tensor  # [B] int64
    own_mask: torch.Tensor  # [B, T, T] bool

    def rows(self) -> torch.Tensor:
        """[B, T] int64: the cache row each own token's K/V is written to."""
        t = self.own_mask.shape[1]
        return self.own_start.unsqueeze(1) + torch.arange(t, device=self.own_start.device)

    def span(self) -> int:
        """Rows [0, span) hold everything any token of the batch sees (one host read of the lengths)."""
        t = self.own_mask.shape[1]
        return int(torch.maximum(self.context_len, self.own_start + t).max())

    def dense(self, capacity: int) -> torch.Tensor:
        """[B, T, S] bool over the slot's S rows (the reference backend's mask)."""
        b, t, _ = self.own_mask.shape
        cols = torch.arange(capacity, device=self.own_mask.device).view(1, 1, capacity)
        rel = cols - self.own_start.view(b, 1, 1)  # [B, 1, S] index among the own tokens
        own = self.own_mask.gather(2, rel.clamp(0, t - 1).expand(b, t, capacity)) & (rel >= 0) & (rel < t)
        return own | (cols < self.context_len.view(b, 1, 1))


ATTENTION_BACKENDS = ("sdpa", "triton")


def resolve_attention(name: str, device: torch.device) -> str:
    """'auto' -> triton on CUDA when triton is installed, else sdpa; an explicit name is checked."""
    from ddtree.engine import triton_attention

    if name == "auto":
        return "triton" if device.type == "cuda" and triton_attention.HAS_TRITON else "sdpa"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {('auto', *ATTENTION_BACKENDS)}, got {name!r}")
    if name == "triton" and not triton_attention.available(device):
        raise ValueError(f"attention backend 'triton' needs triton and a CUDA device (got {device})")
    return name


@dataclass
class AttentionInputs:
    """Per-forward pieces shared by every layer: the reference's bias and RoPE tables (None under triton,
    whose kernels take the visibility and the positions directly)."""

    vis: Visibility
    positions: torch.Tensor  # [B, T]
    rows: torch.Tensor  # [B, T] cache row of each own token
    window: int  # the reference reads cache rows [0, window): the slot capacity, or the batch's span when windowed
    bias: torch.Tensor | None = None  # [B, 1, g*T, window]
    cos: torch.Tensor | None = None  # [B, T, 1, d]
    sin: torch.Tensor | None = None


class Attention:
    """The attention of one model, backend fixed at construction: `prepare` once per forward, then per layer
    `project` (q/k norm, RoPE, K/V into the cache; returns q) and `__call__` (attention over the slot)."""

    def __init__(self, backend: str, num_heads: int, num_kv_heads: int, head_dim: int, theta: float, eps: float,
                 ops: "Pointwise", device: torch.device) -> None:
        self.backend, self.ops, self.eps = backend, ops, eps
        self.num_heads, self.num_kv_heads, self.head_dim, self.theta = num_heads, num_kv_heads, head_dim, theta
        self.inv_freq = rope_inv_freq(head_dim, theta, device)
        # On the CPU (never graph-captured) the reference reads only the rows below the batch's span: the lengths
        # are host memory there, so the read costs nothing, and a slot's capacity is mostly empty (the whole
        # capacity made verify and draft 2x slower than the Hugging Face engine on the default pair). On CUDA the
        # shapes stay static for graph capture and the Triton kernel skips invisible rows itself.
        self.windowed = backend == "sdpa" and device.type == "cpu"

    def prepare(self, vis: Visibility, positions: torch.Tensor, capacity: int, dtype: torch.dtype) -> AttentionInputs:
        window = min(capacity, vis.span()) if self.windowed else capacity
        inputs = AttentionInputs(vis=vis, positions=positions, rows=vis.rows(), window=window)
        if self.backend == "sdpa":
            inputs.bias = attention_bias(vis.dense(window), self.num_heads // self.num_kv_heads, dtype)
            inputs.cos, inputs.sin = rope_tables(positions, self.inv_freq, dtype)
        return inputs

    def project(self, qkv: torch.Tensor, inputs: AttentionInputs, q_norm: torch.Tensor | None,
                k_norm: torch.Tensor | None, keys: torch.Tensor, values: torch.Tensor, *,
                with_q: bool = True) -> torch.Tensor | None:
        """qkv [B, T, (h + 2 h_kv) d] (or [B, T, 2 h_kv d] with with_q=False) -> q [B, T, h, d]; K/V written."""
        hq = self.num_heads if with_q else 0
        kv, d = self.num_kv_heads, self.head_dim
        if self.backend == "triton":
            from ddtree.engine.triton_attention import qkv_epilogue

            return qkv_epilogue(qkv, hq, kv, d, inputs.positions, q_norm, k_norm, inputs.rows, keys, values,
                                self.eps, self.inv_freq)
        b, t, _ = qkv.shape
        q, k, v = qkv.split((hq * d, kv * d, kv * d), dim=-1)
        k = self.ops.norm_rope(k.view(b, t, kv, d), k_norm, inputs.cos, inputs.sin, self.eps)
        write_rows(keys, inputs.rows, k)
        write_rows(values, inputs.rows, v.view(b, t, kv, d))
        if not with_q:
            return None
        return self.ops.norm_rope(q.view(b, t, hq, d), q_norm, inputs.cos, inputs.sin, self.eps)

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 inputs: AttentionInputs) -> torch.Tensor:
        if self.backend == "sdpa":
            window = inputs.window
            return grouped_attention(q, keys[:, :, :window], values[:, :, :window], inputs.bias)
        from ddtree.engine.triton_attention import tree_attention

        vis = inputs.vis
        return tree_attention(q, keys, values, vis.context_len, vis.own_start, vis.own_mask)


def attention_bias(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """mask [B, T, S] bool (True = visible) -> additive bias [B, 1, g*T, S] for `grouped_attention`, built once
    per forward (not per layer): 0 where visible, -inf elsewhere (every row sees at least itself)."""
    b, t, s = mask.shape
    bias = torch.zeros((b, 1, groups, t, s), dtype=dtype, device=mask.device)
    bias.masked_fill_(~mask.view(b, 1, 1, t, s), float("-inf"))
    return bias.view(b, 1, groups * t, s)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention without repeating K/V.

    q [B, T, h, d]; keys / values [B, h_kv, S, d] (a cache slot range, read in place); bias [B, 1, g*T, S]
    (`attention_bias`). The g query heads of one K/V head are stacked along the query axis, so one SDPA call
    with h_kv heads and g*T queries computes every head. Returns [B, T, h * d].
    """
    b, t, h, d = q.shape
    kv = keys.shape[1]
    g = h // kv
    qg = q.view(b, t, kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)  # [B, h_kv, g*T, d]
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=bias)  # [B, h_kv, g*T, d]
    return out.view(b, kv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h * d)


def write_rows(cache: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> None:
    """cache [B, h_kv, S, d]: row rows[b, t] of slot b <- new [B, T, h_kv, d] (in place, any rows)."""
    b, t, kv, d = new.shape
    index = rows.view(b, 1, t, 1).expand(b, kv, t, d)
    cache.scatter_(2, index, new.transpose(1, 2))


def _add_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, then RMSNorm of the sum: (x + delta, norm(x + delta))."""
    y = x + delta
    return y, rms_norm(y, weight, eps)


def _norm_rope(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm (Qwen3's q/k norm; none when weight is None), then RoPE: x [B, T, heads, d]."""
    if weight is not None:
        x = rms_norm(x, weight, eps)
    return apply_rope(x, cos, sin)


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class Pointwise:
    """The elementwise pieces between the matmuls. On CUDA each is one torch.compile'd function (dynamic
    shapes: one compile serves every batch bucket and tree width), which fuses its handful of launches into
    one or two kernels; under CUDA-graph replay the launch count is what separates a forward from its
    weight-streaming floor. Eager elsewhere (the same functions)."""

    norm: object
    add_norm: object
    norm_rope: object
    silu_mul: object

    @classmethod
    def for_device(cls, device: torch.device, compiled: bool | None = None) -> "Pointwise":
        if compiled is None:
            compiled = device.type == "cuda"
        fns = (rms_norm, _add_norm, _norm_rope, _silu_mul)
        if compiled:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            fns = tuple(torch.compile(fn, dynamic=True) for fn in fns)
        return cls(*fns)


@dataclass
class SlotCache:
    """K and V of every layer for every slot: [L, slots, h_kv, S, d] each, allocated once."""

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def allocate(cls, layers: int, slots: int, kv_heads: int, capacity: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> "SlotCache":
        shape = (layers, slots, kv_heads, capacity, head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[3])

    def copy_slot(self, src: int, dst: int, rows: int) -> None:
        """One request's cache into another slot (batch compaction when a request leaves): its first `rows`
        rows (the rows at or beyond a request's committed length are scratch)."""
        n = min(int(rows), self.capacity)
        self.keys[:, dst, :, :n].copy_(self.keys[:, src, :, :n])
        self.values[:, dst, :, :n].copy_(self.values[:, src, :, :n])

    def move_rows(self, batch: int, src_rows: torch.Tensor, dst_rows: torch.Tensor) -> None:
        """Within each of the first `batch` slots, rows dst_rows[b, j] <- rows src_rows[b, j] ([B, J] int64).

        The source rows are gathered before anything is written, so overlapping ranges are safe."""
        layers, _, kv, _, d = self.keys.shape
        j = src_rows.shape[1]
        src = src_rows.view(1, batch, 1, j, 1).expand(layers, batch, kv, j, d)
        dst = dst_rows.view(1, batch, 1, j, 1).expand(layers, batch, kv, j, d)
        for cache in (self.keys, self.values):
            view = cache[:, :batch]
            view.scatter_(3, dst, view.gather(3, src))


# ---- target ------------------------------------------------------------------------------------------

class FusedDecoder:
    """A dense decoder with fused q/k/v and gate/up weights, reading and writing a `SlotCache`.

    `from_hf` shares memory with the Hugging Face model it came from: each HF projection weight becomes a
    view of the fused tensor, so no second copy of the weights exists.
    """

    def __init__(self, shape: DecoderShape, layers: list[dict[str, torch.Tensor]], embed: torch.Tensor,
                 final_norm: torch.Tensor, lm_head: torch.Tensor, feature_layers: tuple[int, ...] = (),
                 attention: str = "auto") -> None:
        self.shape = shape
        self.layers = layers
        self.embed = embed  # [V, H]
        self.final_norm = final_norm  # [H]
        self.lm_head = lm_head  # [V, H]
        self.feature_layers = tuple(feature_layers)  # target layer ids whose outputs feed the drafter
        self.device = embed.device
        self.dtype = embed.dtype
        self.ops = Pointwise.for_device(self.device)
        self.use_attention(attention)

    def use_attention(self, backend: str) -> None:
        """Pick the attention backend (construction, or a benchmark comparing backends on the same weights)."""
        s = self.shape
        self.attention = Attention(resolve_attention(backend, self.device), s.num_heads, s.num_kv_heads,
                                   s.head_dim, s.rope_theta, s.rms_norm_eps, self.ops, self.device)

    # construction -------------------------------------------------------------------------------------
    @classmethod
    @torch.no_grad()
    def from_hf(cls, model: torch.nn.Module, feature_layers: tuple[int, ...] = (), *,
                attention: str = "auto") -> "FusedDecoder":
        shape = shape_of(model.config)
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = _fuse_into_views([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
            entry = {
                "qkv": qkv,
                "o": attn.o_proj.weight,
                "gate_up": _fuse_into_views([mlp.gate_proj.weight, mlp.up_proj.weight]),
                "down": mlp.down_proj.weight,
                "ln1": layer.input_layernorm.weight,
                "ln2": layer.post_attention_layernorm.weight,
            }
            if shape.qkv_bias:
                entry["qkv_bias"] = _fuse_into_views([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
            if shape.qk_norm:
                entry["q_norm"], entry["k_norm"] = attn.q_norm.weight, attn.k_norm.weight
            layers.append(entry)
        return cls(shape, layers, model.get_input_embeddings().weight, base.norm.weight,
                   model.get_output_embeddings().weight, feature_layers, attention)

    @classmethod
    @torch.no_grad()
    def random(cls, shape: DecoderShape, device: torch.device, dtype: torch.dtype, *,
               feature_layers: tuple[int, ...] = (), seed: int = 0, attention: str = "auto") -> "FusedDecoder":
        """Random weights of an architecture's shape (cost measurements; nothing to download)."""
        gen = torch.Generator(device=device).manual_seed(seed)
        hd, kv, h = shape.head_dim, shape.num_kv_heads, shape.num_heads

        def w(*size: int) -> torch.Tensor:
            return (torch.randn(size, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

        ones = torch.ones(shape.hidden_size, device=device, dtype=dtype)
        layers = []
        for _ in range(shape.num_layers):
            entry = {"qkv": w((h + 2 * kv) * hd, shape.hidden_size), "o": w(shape.hidden_size, h * hd),
                     "gate_up": w(2 * shape.intermediate_size, shape.hidden_size),
                     "down": w(shape.hidden_size, shape.intermediate_size), "ln1": ones, "ln2": ones}
            if shape.qkv_bias:
                entry["qkv_bias"] = torch.zeros((h + 2 * kv) * hd, device=device, dtype=dtype)
            if shape.qk_norm:
                entry["q_norm"] = entry["k_norm"] = torch.ones(hd, device=device, dtype=dtype)
            layers.append(entry)
        embed = w(shape.vocab_size, shape.hidden_size)
        return cls(shape, layers, embed, ones, embed, feature_layers, attention)

    def allocate_cache(self, slots: int, capacity: int) -> SlotCache:
        s = self.shape
        return SlotCache.allocate(s.num_layers, slots, s.num_kv_heads, capacity, s.head_dim, self.device, self.dtype)

    # forward ------------------------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] int64
        positions: torch.Tensor,  # [B, T] int64, RoPE positions
        vis: Visibility,  # what each token sees; its own K/V go to rows own_start + t
        cache: SlotCache,
        *,
        first_slot: int = 0,
        logits_at: torch.Tensor | None = None,  # [B] int64: logits of that token only (a prefill's last)
        with_features: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, T, V] (or [B, 1, V] at `logits_at`) and drafter features [B, T, k*H] (or None)."""
        s, ops = self.shape, self.ops
        b, t = tokens.shape
        x = F.embedding(tokens, self.embed)  # [B, T, H]
        attn = self.attention
        inputs = attn.prepare(vis, positions, cache.capacity, x.dtype)
        slots = slice(first_slot, first_slot + b)
        features: dict[int, torch.Tensor] = {}
        y = ops.norm(x, self.layers[0]["ln1"], s.rms_norm_eps)
        for i, w in enumerate(self.layers):
            qkv = F.linear(y, w["qkv"], w.get("qkv_bias"))  # [B, T, (h + 2 h_kv) d]
            keys, values = cache.keys[i, slots], cache.values[i, slots]  # [B, h_kv, S, d] views
            q = attn.project(qkv, inputs, w.get("q_norm"), w.get("k_norm"), keys, values)  # [B, T, h, d]
            x, y = ops.add_norm(x, F.linear(attn(q, keys, values, inputs), w["o"]), w["ln2"], s.rms_norm_eps)
            delta = F.linear(ops.silu_mul(F.linear(y, w["gate_up"])), w["down"])
            following = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.final_norm
            x, y = ops.add_norm(x, delta, following, s.rms_norm_eps)
            if with_features and i in self.feature_layers:
                features[i] = x
        normed = y  # the last add_norm normed with the final norm
        if logits_at is not None:
            at = logits_at.view(b, 1, 1).expand(b, 1, normed.shape[-1])
            logits = F.linear(normed.gather(1, at), self.lm_head)
        else:
            logits = F.linear(normed, self.lm_head)
        if not with_features:
            return logits, None
        # Like Hugging Face's hidden_states tuple, the last layer's entry is the final-normed output.
        last = s.num_layers - 1
        return logits, torch.cat([normed if l == last else features[l] for l in self.feature_layers], dim=-1)


def _fuse_into_views(weights: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate weights along dim 0 and re-point each parameter at its slice of the result."""
    fused = torch.cat([w.detach() for w in weights], dim=0)
    start = 0
    for w in weights:
        n = w.shape[0]
        w.data = fused[start : start + n]
        start += n
    return fused


# ---- drafter -----------------------------------------------------------------------------------------

class StaticDrafter:
    """The DFlash drafter (`ddtree.models.drafter.DFlashDrafter`, weights shared: q/k/v and gate/up fused into
    views) over a `SlotCache` whose rows hold context K/V at their positions, the current block's K/V in the b
    rows right after the context (rows nothing sees until the next round's context overwrites them), and b
    spare rows past the context capacity S for the block of a full slot."""

    def __init__(self, drafter: torch.nn.Module, *, attention: str = "auto") -> None:
        self.module = drafter
        cfg = drafter.config
        self.block_size = int(cfg.block_size)
        self.mask_token_id = int(cfg.mask_token_id)
        self.head_dim = int(cfg.head_dim)
        self.theta = float(cfg.rope_theta)
        self.eps = float(cfg.rms_norm_eps)
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.num_heads = int(cfg.num_attention_heads)
        self.ops = Pointwise.for_device(drafter.fc.weight.device)
        self.attention = Attention(resolve_attention(attention, drafter.fc.weight.device), self.num_heads,
                                   self.num_kv_heads, self.head_dim, self.theta, self.eps, self.ops,
                                   drafter.fc.weight.device)
        self.layers = []
        with torch.no_grad():
            for layer in drafter.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = _fuse_into_views([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
                self.layers.append({
                    "qkv": qkv, "kv": qkv[self.num_heads * self.head_dim:], "o": attn.o_proj.weight,
                    "q_norm": attn.q_norm.weight, "k_norm": attn.k_norm.weight,
                    "gate_up": _fuse_into_views([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    "down": mlp.down_proj.weight, "ln1": layer.input_layernorm.weight,
                    "ln2": layer.post_attention_layernorm.weight,
                })

    def allocate_cache(self, slots: int, capacity: int, device: torch.device, dtype: torch.dtype) -> SlotCache:
        """Context capacity S plus the block's b rows at the end."""
        return SlotCache.allocate(len(self.layers), slots, self.num_kv_heads, capacity + self.block_size,
                                  self.head_dim, device, dtype)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [B, T, k*H] -> context features [B, T, H] (fc + hidden_norm)."""
        m = self.module
        return self.ops.norm(F.linear(features.to(m.fc.weight.dtype), m.fc.weight), m.hidden_norm.weight, self.eps)

    def write_context(self, context: torch.Tensor, positions: torch.Tensor, cache: SlotCache, *,
                      first_slot: int = 0) -> None:
        """Context features [B, T, H] at positions [B, T] (also their cache rows) -> every layer's K/V."""
        b, t, _ = context.shape
        zero = torch.zeros(b, dtype=torch.int64, device=context.device)
        # rows = positions: an own-token visibility starting at row positions[:, 0] (consecutive positions)
        vis = Visibility(context_len=zero, own_start=positions[:, 0].contiguous(),
                         own_mask=torch.ones((b, t, t), dtype=torch.bool, device=context.device))
        inputs = AttentionInputs(vis=vis, positions=positions, rows=positions, window=cache.capacity)  # no attention
        if self.attention.backend == "sdpa":
            inputs.cos, inputs.sin = rope_tables(positions, self.attention.inv_freq, context.dtype)
        slots = slice(first_slot, first_slot + b)
        for i, w in enumerate(self.layers):
            self.attention.project(F.linear(context, w["kv"]), inputs, None, w["k_norm"], cache.keys[i, slots],
                                   cache.values[i, slots], with_q=False)

    def forward_block(self, block_embeds: torch.Tensor, block_positions: torch.Tensor, context_len: torch.Tensor,
                      cache: SlotCache) -> torch.Tensor:
        """One non-causal forward of the block over the cached context of the first B slots.

        block_embeds [B, b, H]; block_positions [B, b]; context_len [B] (the block sees context rows
        [0, context_len)). Returns final-normed hidden states [B, b, H]."""
        ops, eps, attn = self.ops, self.eps, self.attention
        b, length, _ = block_embeds.shape
        x = block_embeds.to(self.module.fc.weight.dtype)
        # the block right after the context, as the target's tree after its committed rows: a windowed reference
        # reads only [0, max context + b)
        vis = Visibility(context_len=context_len, own_start=context_len,
                         own_mask=torch.ones((b, length, length), dtype=torch.bool, device=x.device))
        inputs = attn.prepare(vis, block_positions, cache.capacity, x.dtype)
        y = ops.norm(x, self.layers[0]["ln1"], eps)
        for i, w in enumerate(self.layers):
            keys, values = cache.keys[i, :b], cache.values[i, :b]
            q = attn.project(F.linear(y, w["qkv"]), inputs, w["q_norm"], w["k_norm"], keys, values)
            x, y = ops.add_norm(x, F.linear(attn(q, keys, values, inputs), w["o"]), w["ln2"], eps)
            delta = F.linear(ops.silu_mul(F.linear(y, w["gate_up"])), w["down"])
            following = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.module.norm.weight
            x, y = ops.add_norm(x, delta, following, eps)
        return y


def random_drafter_for(shape: DecoderShape, *, layers: int, block_size: int, target_layer_ids: list[int],
                       mask_token_id: int, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A random-weight DFlash drafter matching a target shape (cost measurements)."""
    from ddtree.models.drafter import DFlashConfig, DFlashDrafter

    torch.manual_seed(seed)
    cfg = DFlashConfig(
        hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim,
        vocab_size=shape.vocab_size, block_size=block_size, mask_token_id=mask_token_id,
        target_layer_ids=target_layer_ids, rms_norm_eps=shape.rms_norm_eps, rope_theta=shape.rope_theta,
        max_position_embeddings=shape.max_position_embeddings, num_target_layers=shape.num_layers,
    )
    with torch.device(device):
        drafter = DFlashDrafter(cfg)
    return drafter.to(dtype=dtype).eval()


def round_up(value: int, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)
