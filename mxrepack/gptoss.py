"""What a gpt-oss checkpoint holds: canonical tensor names, shapes and dtypes, and config mapping.

The canonical naming is the Hugging Face (transformers) layout, ``model.layers.N....``; the
``original/`` layout (``block.N....``, fused ``attn.qkv``) is mapped onto it when read.
Facts: shared/docs/formats.md section 1 (checkpoint), 1.5 (original layout and config mapping).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

EXPERT_PARTS = (
    "gate_up_proj_blocks",
    "gate_up_proj_scales",
    "gate_up_proj_bias",
    "down_proj_blocks",
    "down_proj_scales",
    "down_proj_bias",
)

# The quantization_config of the official checkpoints (formats.md 1.2).
NATIVE_QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}

# Files besides the weights that a model directory needs; copied from source to output.
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "LICENSE",
    "USAGE_POLICY",
)


@dataclass(frozen=True)
class Dims:
    """The sizes that fix every tensor shape."""

    layers: int
    experts: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> "Dims":
        """The sizes from a ``config.json``: KeyError for a missing key, ValueError for a size that is not a positive
        integer (a string or null there would otherwise fail deep in shape arithmetic)."""

        def size(key: str, default: int | None = None) -> int:
            value = config[key] if default is None else config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} is {value!r}, expected a positive integer")
            return value

        return cls(
            layers=size("num_hidden_layers"),
            experts=size("num_local_experts"),
            hidden=size("hidden_size"),
            intermediate=size("intermediate_size"),
            heads=size("num_attention_heads"),
            kv_heads=size("num_key_value_heads"),
            head_dim=size("head_dim", 64),
            vocab=size("vocab_size"),
        )


def expected_tensors(d: Dims) -> dict[str, tuple[tuple[int, ...], str]]:
    """Canonical name -> (shape, kind) of the native MXFP4 checkpoint.

    kind: ``blocks``/``scales`` (uint8 MX data), ``weight`` (BF16 matrix), ``vector`` (BF16/F32
    bias, norm or sinks).
    """
    H, I, E, V = d.hidden, d.intermediate, d.experts, d.vocab
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((V, H), "weight"),
        "model.norm.weight": ((H,), "vector"),
        "lm_head.weight": ((V, H), "weight"),
    }
    for n in range(d.layers):
        p = f"model.layers.{n}."
        out.update(
            {
                p + "input_layernorm.weight": ((H,), "vector"),
                p + "post_attention_layernorm.weight": ((H,), "vector"),
                p + "self_attn.q_proj.weight": ((q, H), "weight"),
                p + "self_attn.q_proj.bias": ((q,), "vector"),
                p + "self_attn.k_proj.weight": ((kv, H), "weight"),
                p + "self_attn.k_proj.bias": ((kv,), "vector"),
                p + "self_attn.v_proj.weight": ((kv, H), "weight"),
                p + "self_attn.v_proj.bias": ((kv,), "vector"),
                p + "self_attn.o_proj.weight": ((H, q), "weight"),
                p + "self_attn.o_proj.bias": ((H,), "vector"),
                p + "self_attn.sinks": ((d.heads,), "vector"),
                p + "mlp.router.weight": ((E, H), "weight"),
                p + "mlp.router.bias": ((E,), "vector"),
                p + "mlp.experts.gate_up_proj_blocks": ((E, 2 * I, H // 32, 16), "blocks"),
                p + "mlp.experts.gate_up_proj_scales": ((E, 2 * I, H // 32), "scales"),
                p + "mlp.experts.gate_up_proj_bias": ((E, 2 * I), "vector"),
                p + "mlp.experts.down_proj_blocks": ((E, H, I // 32, 16), "blocks"),
                p + "mlp.experts.down_proj_scales": ((E, H, I // 32), "scales"),
                p + "mlp.experts.down_proj_bias": ((E, H), "vector"),
            }
        )
    return out


KIND_DTYPES = {
    "blocks": (torch.uint8,),
    "scales": (torch.uint8,),
    "weight": (torch.bfloat16,),
    "vector": (torch.bfloat16, torch.float32),
}


def component(name: str) -> str:
    """Which part of the model a canonical tensor belongs to (for inspect and reports)."""
    if ".mlp.experts." in name:
        return "experts"
    if ".self_attn." in name:
        return "attention"
    if ".mlp.router." in name:
        return "router"
    if name.startswith("model.embed_tokens"):
        return "embeddings"
    if name.startswith("lm_head"):
        return "lm_head"
    return "norms"


# original/ name template <-> canonical name template ({0}: layer, {1}: leaf). formats.md 1.5.
_ORIGINAL_NAMES = [
    ("embedding.weight", "model.embed_tokens.weight"),
    ("unembedding.weight", "lm_head.weight"),
    ("norm.scale", "model.norm.weight"),
    ("block.{0}.attn.norm.scale", "model.layers.{0}.input_layernorm.weight"),
    ("block.{0}.attn.sinks", "model.layers.{0}.self_attn.sinks"),
    ("block.{0}.attn.out.{1}", "model.layers.{0}.self_attn.o_proj.{1}"),
    ("block.{0}.mlp.norm.scale", "model.layers.{0}.post_attention_layernorm.weight"),
    ("block.{0}.mlp.gate.{1}", "model.layers.{0}.mlp.router.{1}"),
    ("block.{0}.mlp.mlp1_weight.{1}", "model.layers.{0}.mlp.experts.gate_up_proj_{1}"),
    ("block.{0}.mlp.mlp1_bias", "model.layers.{0}.mlp.experts.gate_up_proj_bias"),
    ("block.{0}.mlp.mlp2_weight.{1}", "model.layers.{0}.mlp.experts.down_proj_{1}"),
    ("block.{0}.mlp.mlp2_bias", "model.layers.{0}.mlp.experts.down_proj_bias"),
]
_QKV = re.compile(r"block\.(\d+)\.attn\.qkv\.(weight|bias)")
_QKV_PART = re.compile(r"model\.layers\.(\d+)\.self_attn\.[qkv]_proj\.(weight|bias)")


def _template_regex(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{0\}", r"(\d+)").replace(r"\{1\}", r"(weight|bias|blocks|scales)"))


def _translate(name: str, src: int) -> str | None:
    for pair in _ORIGINAL_NAMES:
        m = _template_regex(pair[src]).fullmatch(name)
        if m:
            return pair[1 - src].format(*m.groups())
    return None


def original_to_canonical(name: str, d: Dims) -> list[tuple[str, int, int | None]]:
    """An ``original/`` tensor name -> [(canonical name, first row, stop row or None for all)].

    The fused ``attn.qkv`` splits by rows into q, k, v (formats.md 1.5).
    """
    m = _QKV.fullmatch(name)
    if m:
        n, kind = m.groups()
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        p = f"model.layers.{n}.self_attn."
        return [
            (p + f"q_proj.{kind}", 0, q),
            (p + f"k_proj.{kind}", q, q + kv),
            (p + f"v_proj.{kind}", q + kv, q + 2 * kv),
        ]
    canonical = _translate(name, 0)
    return [(canonical, 0, None)] if canonical else []


def canonical_to_original(name: str) -> str:
    """The ``original/`` tensor holding a canonical tensor (q, k and v all live in the fused qkv)."""
    m = _QKV_PART.fullmatch(name)
    if m:
        return f"block.{m[1]}.attn.qkv.{m[2]}"
    original = _translate(name, 1)
    if original is None:
        raise KeyError(name)
    return original


def hf_config(
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    experts: int,
    experts_per_token: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    sliding_window: int,
    max_positions: int,
    context: int,
    vocab: int,
    eos_token_id: int,
    pad_token_id: int,
    bos_token_id: int | None = None,
    rope_theta: float = 150000.0,
    rope_factor: float = 32.0,
    rope_beta_fast: float = 32.0,
    rope_beta_slow: float = 1.0,
    swiglu_limit: float = 7.0,
    torch_dtype: str | None = None,
    quantization_config: dict | None = None,
) -> dict:
    """A transformers gpt-oss ``config.json`` (sliding and full attention alternating, YaRN rope) for these
    dimensions; ``quantization_config`` defaults to the official checkpoints' MXFP4 one. The one builder behind the
    converted original config, the synthetic fixtures and the tiny trained model."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_local_experts": experts,
        "num_experts_per_tok": experts_per_token,
        "experts_per_token": experts_per_token,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "sliding_window": sliding_window,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": max_positions,
        "initial_context_length": context,
        "rope_theta": rope_theta,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": rope_factor,
            "beta_fast": rope_beta_fast,
            "beta_slow": rope_beta_slow,
            "original_max_position_embeddings": context,
            "truncate": False,
        },
        "swiglu_limit": swiglu_limit,
        "hidden_act": "silu",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-05,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        **({} if bos_token_id is None else {"bos_token_id": bos_token_id}),
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "initializer_range": 0.02,
        "use_cache": True,
        **({} if torch_dtype is None else {"torch_dtype": torch_dtype}),
        "quantization_config": dict(NATIVE_QUANTIZATION_CONFIG) if quantization_config is None else quantization_config,
    }


def hf_config_from_original(orig: dict) -> dict:
    """The transformers ``config.json`` for an ``original/config.json`` (as convert_gpt_oss_weights_to_hf does)."""
    return hf_config(
        hidden=orig.get("hidden_size", 2880),
        intermediate=orig.get("intermediate_size", 2880),
        layers=orig.get("num_hidden_layers", 36),
        experts=orig.get("num_experts", 128),
        experts_per_token=orig.get("experts_per_token", 4),
        heads=orig.get("num_attention_heads", 64),
        kv_heads=orig.get("num_key_value_heads", 8),
        head_dim=orig.get("head_dim", 64),
        sliding_window=orig.get("sliding_window", 128),
        max_positions=131072,
        context=orig.get("initial_context_length", 4096),
        vocab=orig.get("vocab_size", 201088),
        eos_token_id=200002,
        pad_token_id=199999,
        rope_theta=orig.get("rope_theta", 150000.0),
        rope_factor=orig.get("rope_scaling_factor", 32.0),
        rope_beta_fast=orig.get("rope_ntk_beta", 32.0),
        rope_beta_slow=orig.get("rope_ntk_alpha", 1.0),
        swiglu_limit=orig.get("swiglu_limit", 7.0),
    )
