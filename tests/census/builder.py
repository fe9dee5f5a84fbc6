"""Tiny random models of any family, built offline from its config classes (nothing downloaded).

The generic builder takes the family's config class (the one whose ``model_type`` names the family's folder) and
passes it the sizes of :data:`TINY` that it declares as fields; every sub-config (``text_config``,
``vision_config``, ``audio_config``, ...) is shrunk alike, recursively. Keys a config does not declare are never
passed, so one table serves decoders, mixtures of experts, multi-head latent attention and vision towers.
``initializer_range=0.2`` (ten times the usual) makes attention depend on positions strongly enough that a wrong
table moves the logits far beyond float32 noise. :data:`OVERRIDES` holds the few keys a family's config needs
beyond that, each with its reason. The model class is the family's causal LM where it has one, else its
image-text-to-text, sequence-to-sequence or base model (transformers' auto mappings, in that order).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from tests.references import hf_families

VOCAB = 128
#: the sizes every tiny config gets, where the config class declares the key:
#: tests/references/hf_families.py's, and the names other families give the same sizes
TINY: dict[str, Any] = {
    **hf_families.TINY,
    "vocab_size": VOCAB,
    "num_layers": 2,
    "n_layer": 2,
    "num_heads": 4,
    "n_head": 4,
    "head_dim": 16,
    "n_embd": 64,
    "d_model": 64,
    "embed_dim": 64,
    # mixtures of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    # multi-head latent attention
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # encoders and decoders
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 96,
    "decoder_ffn_dim": 96,
    # vision towers
    "depth": 1,
    "out_hidden_size": 64,
    "sliding_window": 8,
}


def _text(**keys: Any) -> dict[str, Any]:
    """An override of the text sub-config: ``keys`` merged into its tiny sizes."""
    return {"text_config": keys}


#: M-RoPE sections for the tiny head (16 channels: 8 pairs), where the family's rotary module falls back to
#: sections of its own ([16, 24, 24]: 64 pairs) when the config names none
_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}

#: Special tokens of the omni thinkers, none of which the census's prompts (ids 3 .. 125) hold
_OMNI_TOKENS = {"vision_start_token_id": 127, "audio_start_token_id": 126, "image_token_id": 127,
                "video_token_id": 127, "audio_token_id": 126}  # fmt: skip

#: Keys a family's config needs beyond :data:`TINY` (merged into its tiny keyword arguments, sub-configs key by
#: key), and why.
OVERRIDES: dict[str, dict[str, Any]] = {
    # its config accepts one expert per token only
    "zaya": {"num_experts_per_tok": 1},
    # a rotated part of 8 channels (4 pairs; the default 1/8 of the tiny head is one pair, whose speed is 1 at any
    # base), and one layer of each rope kind ("main": sliding layers, "compress": compressed ones)
    "deepseek_v4": {
        "partial_rotary_factor": 0.5,
        "layer_types": ["sliding_attention", "compressed_sparse_attention"],
    },
    # rotary position embeddings where the config makes them optional
    "esm": {"position_embedding_type": "rotary"},
    "zamba2": {"use_mem_rope": True},
    "wav2vec2_bert": {"position_embeddings_type": "rotary"},
    "wav2vec2_conformer": {"position_embeddings_type": "rotary"},
    # one expert width per modality (text, vision)
    "ernie4_5_vl_moe": _text(moe_intermediate_size=[32, 32]),
    # M-RoPE sections the tiny head can hold (the module's default needs 64 pairs)
    "qwen2_vl": _text(rope_parameters=_MROPE),
    "qwen2_5_vl": _text(rope_parameters=_MROPE),
    "paddleocr_vl": _text(rope_parameters=_MROPE),
    "glm4v": _text(rope_parameters=_MROPE),
    "glm_ocr": _text(rope_parameters=_MROPE),
    "glm_image": _text(rope_parameters=_MROPE),
    # (the thinker's position ids read its special tokens: ids the random prompt never holds)
    "qwen2_5_omni": {**_text(rope_parameters=_MROPE), **_OMNI_TOKENS},
    "qwen3_omni_moe": _OMNI_TOKENS,
    # (GLM-4V-MoE: a section of zero pairs, as its configs have)
    "glm4v_moe": _text(
        rope_parameters={
            **_MROPE,
            "mrope_section": [0, 2, 2],
            "partial_rotary_factor": 0.5,
        }
    ),
    # hybrids: at least one of the two tiny layers is an attention layer
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {
        "layer_types": ["linear_attention", "full_attention"],
        "position_embedding_type": "rope",
    },
}

#: Parameters that start at zero where a zero hides the positions from the outputs (a parameter whose name ends
#: so gets the value), and why.
PARAMETERS: dict[str, dict[str, float]] = {
    # its key scale starts at 0: every score is 0 and attention ignores the rotation
    "zaya": {"qk_norm.temp": 1.0},
}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if (
            isinstance(value, dict)
            and isinstance(out.get(key), dict)
            and key != "rope_parameters"
        ):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


#: The auto mappings searched for the model class, most useful first: a causal LM gives logits and generation.
_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_MAPPING_NAMES",
)


class NotBuilt(Exception):
    """The generic builder cannot make a tiny model of this family (the message says why)."""


def _fields(config_class: type) -> set[str]:
    if dataclasses.is_dataclass(config_class):
        return {f.name for f in dataclasses.fields(config_class)}
    return set(inspect.signature(config_class.__init__).parameters)


def _sub_config_class(spec: Any) -> type:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = getattr(spec, "config_class", spec)
    if config_class is AutoConfig:
        return CONFIG_MAPPING[spec.model_type]
    return config_class


def _default(config_class: type) -> Any:
    """The class's default config, or None where it cannot be built without arguments."""
    try:
        return config_class()
    except Exception:
        return None


def _shorter(values: list, length: int) -> list:
    """``values`` cut to ``length`` entries, keeping one of each distinct value first (a layer pattern of three
    linear-attention layers and one full-attention layer keeps both kinds)."""
    firsts = [v for i, v in enumerate(values) if v not in values[:i]]
    rest = [v for i, v in enumerate(values) if v in values[:i]]
    return (firsts + rest)[:length]


def _sections(sections: list[int], pairs: int) -> list[int]:
    """M-RoPE sections scaled to ``pairs`` in all, in proportion (a zero stays zero)."""
    total = sum(sections)
    scaled = [max(1, round(s * pairs / total)) if s else 0 for s in sections]
    last = max(i for i, s in enumerate(scaled) if s)
    scaled[last] += pairs - sum(scaled)
    return scaled


def tiny_kwargs(config_class: type, depth: int = 0) -> dict[str, Any]:
    """The keyword arguments of a tiny ``config_class``: :data:`TINY`'s keys that it declares, and each
    sub-config's, recursively (as dicts, with their model_type when the parent resolves them by AutoConfig).
    Read from the class's default config: its lists of one entry per layer are cut to the tiny depth, and its
    M-RoPE sections scaled to the tiny head's pairs. Multi-head latent attention (``qk_rope_head_dim``) rotates
    heads of that width, with as many key-value heads as query heads."""
    fields = _fields(config_class)
    kwargs = {k: v for k, v in TINY.items() if k in fields}
    if "qk_rope_head_dim" in kwargs:
        kwargs["head_dim"] = kwargs["qk_rope_head_dim"]
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    default = _default(config_class)
    layers = getattr(default, "num_hidden_layers", None)
    tiny_layers = kwargs.get("num_hidden_layers")
    if isinstance(layers, int) and tiny_layers and layers > tiny_layers:
        for key in fields - set(kwargs):
            value = getattr(default, key, None)
            if isinstance(value, list) and len(value) == layers:
                kwargs[key] = _shorter(value, tiny_layers)
    params = getattr(default, "rope_parameters", None)
    if (
        isinstance(params, dict)
        and params.get("mrope_section")
        and "head_dim" in kwargs
    ):
        factor = (
            params.get("partial_rotary_factor")
            or getattr(default, "partial_rotary_factor", 1.0)
            or 1.0
        )
        pairs = int(kwargs["head_dim"] * factor) // 2
        kwargs["rope_parameters"] = {
            **params,
            "mrope_section": _sections(params["mrope_section"], pairs),
        }
    specs = getattr(config_class, "sub_configs_defaults", None) or {}
    for key, spec in specs.items():
        if depth > 3 or key not in fields:
            continue
        sub = _sub_config_class(spec)
        kwargs[key] = {**tiny_kwargs(sub, depth + 1), "model_type": sub.model_type}
    return kwargs


def config_classes(family: str) -> list[type]:
    """The config classes of the family's configuration modules, the family's own model_type first."""
    import importlib

    from transformers import PreTrainedConfig

    from tests.census.discovery import models_folder

    found = []
    for path in sorted((models_folder() / family).glob("configuration_*.py")):
        module = importlib.import_module(f"transformers.models.{family}.{path.stem}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, PreTrainedConfig)
                and value.__module__ == module.__name__
                and value.model_type
            ):
                found.append(value)
    return sorted(found, key=lambda c: (c.model_type != family, c.model_type))


def model_class(family: str, configs: list[type]) -> tuple[type, type]:
    """The model class to build and its config class."""
    import transformers
    from transformers.models.auto import modeling_auto

    for mapping in _MAPPINGS:
        names = getattr(modeling_auto, mapping)
        for config in configs:
            name = names.get(config.model_type)
            if isinstance(name, (tuple, list)):
                name = name[0]
            model = getattr(transformers, str(name), None) if name else None
            if isinstance(model, type):
                return model, config
    raise NotBuilt(
        f"no model class of {[c.model_type for c in configs]} in transformers' auto mappings"
    )


def tiny_model(family: str, seed: int = 0) -> Any:
    """The family's tiny model, random weights from ``seed``, in eval mode with eager attention."""
    configs = config_classes(family)
    if not configs:
        raise NotBuilt(f"transformers.models.{family} has no config class")
    model_cls, config_cls = model_class(family, configs)
    own = getattr(model_cls, "config_class", None)
    if isinstance(own, type) and own.model_type:  # e.g. a text config for a ForCausalLM
        config_cls = own
    kwargs = _merged(tiny_kwargs(config_cls), OVERRIDES.get(family, {}))
    try:
        config = config_cls(**kwargs)
    except Exception as error:
        # some families refuse grouped-query attention: one retry with as many kv heads as heads
        if "num_key_value_heads" not in kwargs or "key_value" not in str(error):
            raise NotBuilt(
                f"{config_cls.__name__}(tiny sizes) fails: {_first_line(error)}"
            ) from error
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
        try:
            config = config_cls(**kwargs)
        except Exception as again:
            raise NotBuilt(
                f"{config_cls.__name__}(tiny sizes) fails: {_first_line(again)}"
            ) from again
    config._attn_implementation = "eager"
    for sub in _sub_configs(config):
        sub._attn_implementation = "eager"
    torch.manual_seed(seed)
    try:
        model = model_cls(config)
    except Exception as error:
        raise NotBuilt(
            f"{model_cls.__name__}(tiny config) fails: {_first_line(error)}"
        ) from error
    # some families start projections at zero (Zaya, NeoMME): their attention, and so their rotary tables,
    # would not reach the outputs; such weight matrices get small random values
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() >= 2 and not weight.any():
                weight.normal_(0.0, 0.05)
        for name, weight in model.named_parameters():
            for end, value in PARAMETERS.get(family, {}).items():
                if name.endswith(end):
                    weight.fill_(value)
    return model.eval()


def _first_line(error: BaseException) -> str:
    """The error's type and its most telling line (a strict dataclass's validator puts it second)."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    text = lines[-1] if len(lines) > 1 else (lines[0] if lines else "")
    return f"{type(error).__name__}: {text}"[:400]


def _sub_configs(config: Any) -> list[Any]:
    from transformers import PreTrainedConfig

    found, queue = [], [config]
    while queue:
        current = queue.pop()
        for value in vars(current).values():
            if isinstance(value, PreTrainedConfig) and value not in found:
                found.append(value)
                queue.append(value)
    return found


#: waveform samples per token of the census's prompt length, for a speech encoder fed input_values (Moonshine's
#: convolutions take 384 samples to a frame)
AUDIO_SAMPLES = 400


def inputs(model: Any, batch: int = 2, length: int = 12) -> dict[str, torch.Tensor]:
    """Random inputs (seeded) in the forward's own keywords: input_ids, or a waveform (input_values) for a speech
    encoder, and decoder_input_ids for an encoder-decoder; a model that takes neither raises :class:`NotBuilt`."""
    names = set(inspect.signature(model.forward).parameters)
    audio = "input_ids" not in names and "input_values" in names
    if "input_ids" not in names and not audio:
        raise NotBuilt(
            f"{type(model).__name__}.forward takes no input_ids or input_values (a prompt of tokens or a "
            "waveform is all the census feeds)"
        )
    vocab = (
        getattr(model.config.get_text_config(decoder=True), "vocab_size", None) or VOCAB
    )
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(3, min(vocab, VOCAB) - 1, (batch, length), generator=generator)
    # a speech encoder (Moonshine) takes a waveform
    given = (
        {
            "input_values": torch.randn(
                batch, length * AUDIO_SAMPLES, generator=generator
            )
        }
        if audio
        else {}
    )
    given |= {} if audio else {"input_ids": ids}
    if (
        getattr(model.config, "is_encoder_decoder", False)
        and "decoder_input_ids" in names
    ):
        given["decoder_input_ids"] = ids[:, : length // 2]
    return given
