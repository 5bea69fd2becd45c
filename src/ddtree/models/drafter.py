"""DFlash block-diffusion drafter (Qwen3-style layers with KV injection of target features).

Architecture (the layout of the public DFlash drafters, so a hub checkpoint loads with this code):
  * context features = the target's hidden states at `target_layer_ids` (HF `output_hidden_states`
    tuple, index 0 = embeddings, so target layer l is index l + 1), concatenated on the feature axis,
    projected by `fc` (k*H -> H, no bias) and normalised by `hidden_norm`;
  * a few Qwen3 decoder layers (RMSNorm, q/k-norm, RoPE, SwiGLU MLP). In every layer the K/V are
    computed over [context features ; block] ("KV injection"), the queries from the block only, and the
    attention is NON-causal (every block position sees the whole block and the whole context);
  * a final `norm`. Token embeddings and the LM head are borrowed from the target.
Parameter names: `fc.weight`, `hidden_norm.weight`, `norm.weight`, `layers.N.input_layernorm.weight`,
`layers.N.post_attention_layernorm.weight`, `layers.N.self_attn.{q,k,v,o}_proj.weight`,
`layers.N.self_attn.{q,k}_norm.weight`, `layers.N.mlp.{gate,up,down}_proj.weight` (no `model.` prefix;
one is stripped on load if present). Config: Qwen3 fields + top-level `block_size` + `dflash_config`
{`mask_token_id`, `target_layer_ids`} (top-level copies of those two are accepted too). Not supported:
sliding-window drafter layers and the DFlash2 extras (attention_conv, candidate_selector).

Context / bonus convention (training and inference MUST agree; see `training_block_mask`):
  A round drafts the block `[bonus, mask * (block_size - 1)]` at absolute positions
  `start .. start + block_size - 1`, where `start` is the bonus token's own position. The context holds
  the target features of every committed token EXCEPT the bonus (positions `0 .. start - 1`): the bonus
  was just picked by the target and its hidden state is only known after the next verify forward.
  Context keys get RoPE at their own absolute positions. Draft logits = `lm_head(hidden[:, 1:])`, i.e.
  D = block_size - 1 positions predicting the tokens at `start + 1 .. start + block_size - 1`.
  Training uses the same convention: a block anchored at position `a` sees context positions `< a`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default choice of target layers: evenly spaced in [1, num_target_layers - 3] (DFlash's rule)."""
    if num_target_layers <= 0 or num_draft_layers <= 0:
        raise ValueError(
            f"num_target_layers ({num_target_layers}) and num_draft_layers ({num_draft_layers}) must be > 0"
        )
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    lo, hi = 1, max(1, num_target_layers - 3)
    return [int(round(lo + i * (hi - lo) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    """Drafter configuration (Qwen3 fields + DFlash fields). Unknown keys survive a save/load round trip."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    num_target_layers: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must be a non-empty list")
        self.target_layer_ids = [int(x) for x in self.target_layer_ids]

    _KNOWN = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "head_dim", "rms_norm_eps", "max_position_embeddings",
        "attention_bias", "num_target_layers", "block_size", "dflash_config", "rope_theta",
        "mask_token_id", "target_layer_ids",
    )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DFlashConfig":
        dflash = dict(d.get("dflash_config") or {})
        block_size = d.get("block_size", dflash.get("block_size"))
        if block_size is None:
            raise ValueError("drafter config has no 'block_size' (top level or under 'dflash_config')")
        # Some exported drafters put the DFlash keys at the top level instead of under dflash_config.
        for key in ("mask_token_id", "target_layer_ids"):
            if key not in dflash and key in d:
                dflash[key] = d[key]
        if "mask_token_id" not in dflash:
            raise ValueError("drafter config has no 'dflash_config.mask_token_id'")
        rope_theta = d.get("rope_theta")
        if rope_theta is None:  # transformers 5 style
            rope_theta = (d.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
        layer_ids = dflash.get("target_layer_ids")
        if layer_ids is None:
            if d.get("num_target_layers") is None:
                raise ValueError("drafter config needs dflash_config.target_layer_ids or num_target_layers")
            layer_ids = build_target_layer_ids(int(d["num_target_layers"]), int(d["num_hidden_layers"]))
        try:
            return cls(
                hidden_size=int(d["hidden_size"]),
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=int(d["num_attention_heads"]),
                num_key_value_heads=int(d.get("num_key_value_heads", d["num_attention_heads"])),
                vocab_size=int(d["vocab_size"]),
                block_size=int(block_size),
                mask_token_id=int(dflash["mask_token_id"]),
                target_layer_ids=list(layer_ids),
                head_dim=d.get("head_dim"),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                max_position_embeddings=int(d.get("max_position_embeddings", 40960)),
                attention_bias=bool(d.get("attention_bias", False)),
                num_target_layers=d.get("num_target_layers"),
                extra={k: v for k, v in d.items() if k not in cls._KNOWN},
            )
        except KeyError as exc:
            raise ValueError(f"drafter config is missing required key {exc.args[0]!r}") from None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3"}
        d.update(self.extra)
        d.update(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
            block_size=self.block_size,
            dflash_config={
                **dict(self.extra.get("dflash_config", {})),
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        )
        if self.num_target_layers is not None:
            d["num_target_layers"] = self.num_target_layers
        return d


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()  # normalise in fp32 like Qwen3 (bf16 variance is too coarse)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, 1, T, head_dim] (default RoPE, halves layout like HF)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )  # [hd/2]
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [B, T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, hd]
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, h, T, hd] rotated by cos/sin [B, 1, T, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DrafterCache:
    """Per-layer K/V of the CONTEXT entries only (block K/V are never cached).

    Layout per layer: keys/values [B, num_kv_heads, T, head_dim], RoPE already applied. All requests in
    the batch share one length; ragged batches pass an `attention_mask` to the drafter instead.
    """

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        k = self.keys[0]
        return 0 if k is None else int(k.shape[2])

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this layer's new context K/V; returns the whole cached K/V of the layer."""
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]  # type: ignore[return-value]

    def crop(self, n: int) -> None:
        """Keep the first n context entries (n <= length)."""
        if n < 0:
            raise ValueError(f"crop length n must be >= 0, got {n}")
        if n > self.length:
            raise ValueError(f"crop length n={n} exceeds cache length {self.length}")
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[:, :, :n], v[:, :, :n]  # type: ignore[index]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (e.g. after a request finished): index [B'] int64."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[index], v[index]  # type: ignore[index]


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        hd = int(cfg.head_dim)  # type: ignore[arg-type]
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v  # [B, kvh, T, hd] each

    def forward(
        self,
        x: torch.Tensor,  # [B, L, H] normed block
        context: torch.Tensor,  # [B, T, H] context features (not normed by this layer)
        rope_block: tuple[torch.Tensor, torch.Tensor],
        rope_ctx: tuple[torch.Tensor, torch.Tensor],
        cache: DrafterCache | None,
        layer_idx: int,
        attn_mask: torch.Tensor | None,  # [B, 1, L, S] bool, True = may attend
    ) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, L, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, *rope_block)  # [B, h, L, hd]
        k_ctx, v_ctx = self._kv(context, *rope_ctx)
        if cache is not None:
            k_ctx, v_ctx = cache.append(layer_idx, k_ctx, v_ctx)
        k_blk, v_blk = self._kv(x, *rope_block)
        k = torch.cat([k_ctx, k_blk], dim=2)  # [B, kvh, S, hd]
        v = torch.cat([v_ctx, v_blk], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=False)  # [B, h, L, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, L, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [B, L, H]
        context: torch.Tensor,  # [B, T, H]
        rope_block: tuple[torch.Tensor, torch.Tensor],
        rope_ctx: tuple[torch.Tensor, torch.Tensor],
        cache: DrafterCache | None,
        layer_idx: int,
        attn_mask: torch.Tensor | None,  # [B, 1, L, S] bool
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope_block, rope_ctx, cache, layer_idx, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The drafter. `forward` returns final-normed hidden states of the block [B, L, H]."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        H = config.hidden_size
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.fc = nn.Linear(len(config.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def new_cache(self) -> DrafterCache:
        return DrafterCache(self.config.num_hidden_layers)

    def extract_context(self, hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
        """HF hidden-states tuple (index 0 = embeddings) -> context features [B, T, H] (fc + hidden_norm)."""
        n = len(hidden_states)
        bad = [i for i in self.config.target_layer_ids if not 0 <= i + 1 < n]
        if bad:
            raise ValueError(f"target_layer_ids {bad} out of range for a hidden_states tuple of length {n}")
        feats = torch.cat([hidden_states[i + 1] for i in self.config.target_layer_ids], dim=-1)  # [B, T, k*H]
        return self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))

    def forward(
        self,
        block_embeds: torch.Tensor,  # [B, L, H]
        block_positions: torch.Tensor,  # [B, L] int64
        context: torch.Tensor,  # [B, T, H] (T may be 0)
        context_positions: torch.Tensor,  # [B, T] int64
        cache: DrafterCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B, L, S] bool, S = cache.length + T + L
    ) -> torch.Tensor:
        if block_embeds.dim() != 3 or context.dim() != 3:
            raise ValueError(
                f"block_embeds and context must be [B, L, H] / [B, T, H], got {tuple(block_embeds.shape)} "
                f"and {tuple(context.shape)}"
            )
        B, L, _ = block_embeds.shape
        T = context.shape[1]
        if tuple(block_positions.shape) != (B, L):
            raise ValueError(f"block_positions must be [{B}, {L}], got {tuple(block_positions.shape)}")
        if tuple(context_positions.shape) != (B, T):
            raise ValueError(f"context_positions must be [{B}, {T}], got {tuple(context_positions.shape)}")
        dtype = self.fc.weight.dtype
        x, context = block_embeds.to(dtype), context.to(dtype)
        hd, theta = int(self.config.head_dim), self.config.rope_theta  # type: ignore[arg-type]
        rope_block = rope_cos_sin(block_positions, hd, theta, dtype)
        rope_ctx = rope_cos_sin(context_positions, hd, theta, dtype)
        mask = None
        if attention_mask is not None:
            S = (cache.length if cache is not None else 0) + T + L
            if tuple(attention_mask.shape) != (B, L, S):
                raise ValueError(f"attention_mask must be [{B}, {L}, {S}], got {tuple(attention_mask.shape)}")
            mask = attention_mask.to(torch.bool).unsqueeze(1)  # [B, 1, L, S]
        for i, layer in enumerate(self.layers):
            x = layer(x, context, rope_block, rope_ctx, cache, i, mask)
        return self.norm(x)

    # ---- persistence -------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        d = self.config.to_dict()
        d["torch_dtype"] = str(self.fc.weight.dtype).replace("torch.", "")
        (path / CONFIG_NAME).write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
    ) -> "DFlashDrafter":
        """Load from a directory with config.json + model.safetensors (or a sharded index).

        dtype default: float32 on CPU, bfloat16 on CUDA.
        """
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"drafter directory not found: {path}")
        cfg_file = path / CONFIG_NAME
        if not cfg_file.is_file():
            raise FileNotFoundError(f"drafter config not found: {cfg_file}")
        config = DFlashConfig.from_dict(json.loads(cfg_file.read_text()))
        if (path / WEIGHTS_NAME).is_file():
            files = [path / WEIGHTS_NAME]
        elif (path / WEIGHTS_INDEX_NAME).is_file():
            index = json.loads((path / WEIGHTS_INDEX_NAME).read_text())
            files = [path / f for f in sorted(set(index["weight_map"].values()))]
        else:
            raise FileNotFoundError(f"drafter weights not found: {path / WEIGHTS_NAME}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            for k, v in load_file(str(f)).items():
                state[k[len("model."):] if k.startswith("model.") else k] = v
        device = torch.device(device) if device is not None else torch.device("cpu")
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = cls(config)
        expected = set(model.state_dict())
        missing = sorted(expected - set(state))
        if missing:
            raise ValueError(f"drafter weights in {path} lack parameters: {missing[:8]}")
        # A copied embed_tokens / lm_head is ignored (the target provides them); anything else means an
        # architecture this module does not implement (e.g. DFlash2's attention_conv): refuse it.
        unknown = sorted(k for k in set(state) - expected if not k.startswith(("embed_tokens.", "lm_head.")))
        if unknown:
            raise ValueError(f"drafter weights in {path} hold unsupported parameters: {unknown[:8]}")
        model.load_state_dict({k: state[k] for k in expected}, strict=True)
        return model.to(device=device, dtype=dtype).eval()


# ---- helpers shared by the engine, the trainer and the evaluator ----------------------------------

def block_input_ids(bonus: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """bonus [B] -> block token ids [B, block_size] = [bonus, mask * (block_size - 1)]."""
    ids = torch.full((bonus.shape[0], block_size), mask_token_id, dtype=torch.long, device=bonus.device)
    ids[:, 0] = bonus
    return ids


def training_block_mask(
    anchors: torch.Tensor, seq_len: int, block_size: int, valid_len: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention mask for many blocks per sequence in one forward (training layout).

    anchors [B, M] int64 (block m of row b starts at position anchors[b, m]); the forward's keys are
    [context (seq_len positions) ; M blocks of block_size]. Returns [B, M * block_size, seq_len + M * block_size]
    bool: a block query sees context positions < its anchor (the inference convention: the bonus's own
    features are not context) and every position of its own block (non-causal), nothing else.
    `valid_len` [B] optionally hides padded context positions (>= valid_len).
    """
    B, M = anchors.shape
    Lb = M * block_size
    pos = torch.arange(seq_len, device=anchors.device)
    ctx = pos.view(1, 1, seq_len) < anchors.unsqueeze(-1)  # [B, M, T]
    if valid_len is not None:
        ctx = ctx & (pos.view(1, 1, seq_len) < valid_len.view(B, 1, 1))
    ctx = ctx.repeat_interleave(block_size, dim=1)  # [B, Lb, T]
    blk_id = torch.arange(Lb, device=anchors.device) // block_size  # [Lb]
    own = (blk_id.view(-1, 1) == blk_id.view(1, -1)).unsqueeze(0).expand(B, Lb, Lb)  # [B, Lb, Lb]
    return torch.cat([ctx, own], dim=-1)


def draft_logits(
    drafter: DFlashDrafter,
    embed_tokens: nn.Module,
    lm_head: nn.Module,
    bonus: torch.Tensor,  # [B] int64 bonus tokens
    start: torch.Tensor | int,  # bonus position(s): int or [B]
    context: torch.Tensor,  # [B, T, H] NEW context features (positions start - T .. start - 1)
    cache: DrafterCache | None,
) -> torch.Tensor:
    """One drafting forward, inference convention. Returns draft logits [B, D, V] (D = block_size - 1).

    With a cache, `context` holds only the features not yet cached; cache.length must equal start - T
    (one shared length), and afterwards the cache holds `start` entries. The caller crops it on rejection.
    """
    cfg = drafter.config
    B, T = bonus.shape[0], context.shape[1]
    dev = bonus.device
    if cache is not None and isinstance(start, int) and cache.length + T != start:
        raise ValueError(f"cache.length ({cache.length}) + new context ({T}) must equal start ({start})")
    start_t = torch.as_tensor(start, device=dev, dtype=torch.long).expand(B)  # [B]
    offs = torch.arange(cfg.block_size, device=dev)
    block_pos = start_t.unsqueeze(1) + offs  # [B, L]
    ctx_pos = start_t.unsqueeze(1) - T + torch.arange(T, device=dev)  # [B, T]
    ids = block_input_ids(bonus, cfg.block_size, cfg.mask_token_id)
    hidden = drafter(embed_tokens(ids), block_pos, context, ctx_pos, cache)  # [B, L, H]
    return lm_head(hidden[:, 1:])  # [B, D, V]
