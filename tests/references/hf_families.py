"""Tiny random decoders of transformers 5.23, one per family, built offline from configs (nothing downloaded).

Each :class:`Family` names a model class of the installed transformers and a tiny config (2 layers, hidden size 64,
vocabulary 96, positions up to 128) with the rotary settings that family is tested for: every ``rope_type``,
partial rotary, per-layer-type parameters, interleaved layouts and MLA, M-RoPE. ``initializer_range=0.2`` (ten
times the usual) makes attention depend on positions strongly enough that a wrong table changes the logits by far
more than float32 noise. tests/conventions/test_hf.py swaps ``posenc.HFRotaryEmbedding`` into each one;
book/16_hugging_face uses the same list.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

VOCAB = 96
#: the sizes every tiny config shares (a family's own keys override them)
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Family:
    """A family of transformers 5.23 and what its tiny model tests."""

    name: str  # transformers' model_type (the modeling module's folder)
    model: str  # the class built, e.g. "LlamaForCausalLM"
    covers: str  # what the family exercises
    config: dict[str, Any] = field(default_factory=dict)  # beyond TINY
    config_class: str = ""  # default: the model class's config class
    # a Qwen-VL model's vision config (an image in the prompt), or None
    vision: dict[str, Any] | None = None
    rotary_path: str = "model.rotary_emb"  # where the model holds its rotary module


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32, "rope_theta": 5e5}  # fmt: skip
LONGROPE = {"rope_type": "longrope", "rope_theta": 1e4,
            "short_factor": [1.0 + 0.05 * i for i in range(4)],
            "long_factor": [1.0 + 0.8 * i for i in range(4)]}  # fmt: skip

FAMILIES: tuple[Family, ...] = (
    Family("llama", "LlamaForCausalLM", "default"),
    Family("llama", "LlamaForCausalLM", "llama3 (Llama 3.1's blend)",
           {"rope_parameters": dict(LLAMA31)}),
    Family("mistral", "MistralForCausalLM", "linear",
           {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
    Family("qwen2", "Qwen2ForCausalLM", "yarn",
           {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                "original_max_position_embeddings": 32}}),
    Family("qwen3", "Qwen3ForCausalLM", "dynamic (NTK, past max_position_embeddings)",
           {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
            "max_position_embeddings": 16, "head_dim": 16}),
    Family("phi3", "Phi3ForCausalLM", "longrope, partial rotary 0.5 (Phi-3)",
           {"rope_parameters": dict(LONGROPE), "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 14, "max_position_embeddings": 128}),
    Family("gemma4", "Gemma4ForCausalLM", "proportional, per-layer types and head sizes",
           {"layer_types": ["sliding_attention", "full_attention"], "head_dim": 16,
            "global_head_dim": 32, "sliding_window": 8, "num_key_value_heads": 1,
            "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": VOCAB},
           config_class="Gemma4TextConfig"),
    Family("gemma3", "Gemma3ForCausalLM", "per-layer bases 1e4 / 1e6 (Gemma 3)",
           {"layer_types": ["sliding_attention", "full_attention"], "head_dim": 16,
            "sliding_window": 8, "query_pre_attn_scalar": 16}, config_class="Gemma3TextConfig"),
    Family("olmo3", "Olmo3ForCausalLM", "per-layer types, float32 tables",
           {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}),
    Family("gpt_neox", "GPTNeoXForCausalLM", "partial rotary 0.25 (GPT-NeoX)",
           {"rotary_pct": 0.25}, rotary_path="gpt_neox.rotary_emb"),
    Family("phi", "PhiForCausalLM", "partial rotary 0.5 (Phi-2)", {"partial_rotary_factor": 0.5}),
    Family("stablelm", "StableLmForCausalLM", "partial rotary 0.25"),
    Family("persimmon", "PersimmonForCausalLM", "partial rotary 0.5"),
    Family("nemotron", "NemotronForCausalLM", "partial rotary 0.5, head_dim 32",
           {"head_dim": 32}),
    Family("cohere", "CohereForCausalLM", "interleaved tables and pairs"),
    Family("cohere2", "Cohere2ForCausalLM", "interleaved, sliding-window layers",
           {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
            "head_dim": 16}),
    Family("glm", "GlmForCausalLM", "halves tables, interleaved pairs, partial 0.5",
           {"head_dim": 16}),
    Family("glm4", "Glm4ForCausalLM", "halves tables, interleaved pairs, partial 0.5",
           {"head_dim": 16}),
    Family("helium", "HeliumForCausalLM", "halves tables, interleaved pairs", {"head_dim": 16}),
    Family("ernie4_5", "Ernie4_5ForCausalLM", "interleaved pairs, float32 tables",
           {"head_dim": 16}),
    Family("deepseek_v3", "DeepseekV3ForCausalLM", "MLA, yarn with mscale, rope_interleave",
           {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
            "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_group": 1, "topk_group": 1, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
            "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                "original_max_position_embeddings": 32, "mscale": 1.0,
                                "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}}),
    Family("deepseek_v2", "DeepseekV2ForCausalLM", "MLA, complex (torch.polar) tables",
           {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
            "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_group": 1, "topk_group": 1, "moe_intermediate_size": 32, "first_k_dense_replace": 1}),
    Family("gpt_oss", "GptOssForCausalLM", "half-width tables, yarn (gpt-oss)",
           {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
            "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
            "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1.5e5,
                                "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False}}),
    Family("olmo2", "Olmo2ForCausalLM", "float32 tables"),
    Family("granite", "GraniteForCausalLM", "default (Granite multipliers)"),
    Family("starcoder2", "Starcoder2ForCausalLM", "default, base 1e5",
           {"rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}),
    Family("qwen2_vl", "Qwen2VLForConditionalGeneration", "M-RoPE sections (Qwen2-VL)",
           {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                "mrope_section": [2, 3, 3]}},
           vision={"embed_dim": 32, "hidden_size": 64}, rotary_path="model.language_model.rotary_emb"),
    Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "M-RoPE sections (Qwen2.5-VL)",
           {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                "mrope_section": [2, 3, 3]}},
           vision={"hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 64},
           rotary_path="model.language_model.rotary_emb"),
    Family("qwen3_vl", "Qwen3VLForConditionalGeneration", "interleaved M-RoPE (Qwen3-VL)",
           {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                                "mrope_section": [2, 3, 3], "mrope_interleaved": True},
            "head_dim": 16},
           vision={"hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 64,
                   "num_position_embeddings": 16, "deepstack_visual_indexes": []},
           rotary_path="model.language_model.rotary_emb"),
)  # fmt: skip


def _transformers() -> Any:
    import transformers

    return transformers


def tiny_config(family: Family) -> Any:
    """The family's tiny config (for a vision model: the whole config, text and vision parts)."""
    t = _transformers()
    model_class = getattr(t, family.model)
    if family.vision is not None:
        return _vision_config(family, model_class)
    config_class = (
        getattr(t, family.config_class)
        if family.config_class
        else model_class.config_class
    )
    return config_class(**{**TINY, **family.config})


def _vision_config(family: Family, model_class: type) -> Any:
    text = {**TINY, **family.config}
    vision = {"depth": 1, "num_heads": 2, "patch_size": 2, "temporal_patch_size": 2,
              "in_channels": 3, "spatial_merge_size": 2, "window_size": 8,
              "fullatt_block_indexes": [0], **family.vision}  # fmt: skip
    ids = {"image_token_id": 90, "video_token_id": 91, "vision_start_token_id": 92,
           "vision_end_token_id": 93}  # fmt: skip
    return model_class.config_class(text_config=text, vision_config=vision, **ids)


@functools.cache
def tiny_model(index: int) -> Any:
    """FAMILIES[index]'s model, random weights from a fixed seed, in eval mode (cached: shared by tests)."""
    family = FAMILIES[index]
    config = tiny_config(family)
    config._attn_implementation = "eager"
    torch.manual_seed(1000 + index)
    model = getattr(_transformers(), family.model)(config)
    return model.eval()


def rotary_of(model: Any, family: Family) -> Any:
    """The model's rotary module (at ``family.rotary_path``)."""
    return functools.reduce(getattr, family.rotary_path.split("."), model)


def set_rotary(model: Any, family: Family, module: Any) -> None:
    owner, _, name = family.rotary_path.rpartition(".")
    setattr(functools.reduce(getattr, owner.split("."), model), name, module)


def prompt(family: Family, batch: int = 2, length: int = 12) -> dict[str, torch.Tensor]:
    """Model inputs: random token ids (seeded); for a vision model, an image of 2 x 4 merged patches
    (8 image tokens) after 3 text tokens, so that its tokens' positions differ per axis."""
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 90, (batch, length), generator=generator)
    if family.vision is None:
        return {"input_ids": ids}
    # temporal, height, width patches: 32 patches, merged 2 x 2 -> 8 tokens
    grid = (1, 4, 8)
    image = torch.full((batch, 8), 90)
    ids = torch.cat(
        [
            ids[:, :3],
            torch.full((batch, 1), 92),
            image,
            torch.full((batch, 1), 93),
            ids[:, 3:],
        ],
        1,
    )
    patches = torch.randn(batch * 32, 3 * 2 * 2 * 2, generator=generator)
    return {"input_ids": ids, "pixel_values": patches, "image_grid_thw": torch.tensor([grid] * batch),
            "mm_token_type_ids": (ids == 90).int()}  # fmt: skip


def greedy(
    model: Any, inputs: dict[str, torch.Tensor], steps: int = 4
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy decoding with the KV cache (``model.generate``): the new tokens ``[batch, steps]`` and the logits
    of each step."""
    out = model.generate(
        **inputs, max_new_tokens=steps, do_sample=False, output_logits=True,
        return_dict_in_generate=True, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    return out.sequences[:, inputs["input_ids"].shape[1] :], list(out.logits)
