"""mmbatch.tiny_models: offline model directories that real vLLM and transformers load.

Fast tests check the files (same seed, same bytes), the tokenizer layout, the processors and
the real-shape directories (vLLM's configuration accepts each, without weights). The ``slow``
tests start vLLM's CPU engine on the Qwen families, one engine at a time, and check that
greedy generation works and repeats itself exactly; tests/tiny_models/test_families.py (two
families) and tests/manual/test_family_sweep.py (the rest) run every other family through
``mmbatch caption``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmbatch.errors import ConfigError
from mmbatch.tiny_models import (
    FAMILIES,
    FAMILY_MEDIA,
    QWEN_SPECIAL_TOKENS,
    REAL_SHAPES,
    TINY_SPECIAL_TOKENS,
    build_tiny_model,
    write_real_shape,
)

TINY_VOCAB = 1024
TOKEN_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
TINY_FILES = TOKEN_FILES | {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "processor_config.json",
}
VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen2_audio", "qwen3_vl")
OTHER_FAMILIES = tuple(f for f in FAMILIES if f not in QWEN_FAMILIES)
QWEN_REAL_SHAPES = ("qwen2_5_vl_7b", "qwen2_vl_7b")

EXPECTED_IMAGE_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EXPECTED_AUDIO_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nWhat do you hear?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
IMAGE_MESSAGES = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}],
    }
]
AUDIO_MESSAGES = [
    {
        "role": "user",
        "content": [{"type": "audio"}, {"type": "text", "text": "What do you hear?"}],
    }
]


class ModelDirs:
    """Builds each (family, seed, copy) at most once per session."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._built: dict[tuple[str, int, int], Path] = {}
        self._real: dict[str, Path] = {}

    def tiny(self, family: str, seed: int = 0, copy: int = 0) -> Path:
        key = (family, seed, copy)
        if key not in self._built:
            out = self._factory.mktemp(f"tiny-{family}-s{seed}-c{copy}")
            self._built[key] = build_tiny_model(out, family, seed)
        return self._built[key]

    def real(self, name: str) -> Path:
        if name not in self._real:
            self._real[name] = write_real_shape(self._factory.mktemp(f"real-{name}"), name)
        return self._real[name]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> ModelDirs:
    return ModelDirs(tmp_path_factory)


def read_tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def read_config(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path / "config.json").read_text())
    return data


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    sub: dict[str, Any] = config.get("text_config", config)
    return sub


# ---------------------------------------------------------------- the package itself


def test_import_loads_no_heavy_module() -> None:
    code = (
        "import sys, mmbatch.tiny_models\n"
        "heavy = [m for m in ('torch', 'transformers', 'tokenizers', 'safetensors', 'vllm',"
        " 'numpy', 'PIL') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("family", ["qwen2", "llava", "", "QWEN2_VL"])
def test_unknown_family_is_a_config_error(tmp_path: Path, family: str) -> None:
    with pytest.raises(ConfigError, match="unknown tiny model family"):
        build_tiny_model(tmp_path / "m", family)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed_is_a_config_error(tmp_path: Path, seed: Any) -> None:
    with pytest.raises(ConfigError, match="seed"):
        build_tiny_model(tmp_path / "m", "qwen2_vl", seed)


def test_unknown_real_shape_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown real shape"):
        write_real_shape(tmp_path / "r", "qwen2_5_vl_72b")
    assert not (tmp_path / "r").exists()


def test_exports() -> None:
    assert FAMILIES == (
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen2_audio",
        "qwen3_vl",
        "llava_onevision",
        "internvl",
        "gemma3",
        "idefics3",
        "mistral3",
        "audioflamingo3",
    )
    assert set(FAMILY_MEDIA) == set(FAMILIES)
    assert REAL_SHAPES == ("qwen2_5_vl_7b", "qwen2_vl_7b", "gemma3_4b")


def test_the_cli_offers_every_family_and_real_shape(tmp_path: Path) -> None:
    from mmbatch.cli import EXIT_OK, main

    with pytest.raises(SystemExit):
        main(["make-tiny-model", str(tmp_path / "x"), "--family", "llava"])
    assert main(["make-tiny-model", str(tmp_path / "g"), "--family", "gemma3"]) == EXIT_OK
    assert read_config(tmp_path / "g")["model_type"] == "gemma3"
    with pytest.raises(SystemExit):
        main(["make-tiny-model", str(tmp_path / "r"), "--real-shape", "gemma3_27b"])


# ---------------------------------------------------------------- tiny models: files


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_gives_the_same_bytes(model_dirs: ModelDirs, family: str) -> None:
    first = read_tree(model_dirs.tiny(family))
    second = read_tree(model_dirs.tiny(family, copy=1))
    assert set(first) == TINY_FILES
    assert first.keys() == second.keys()
    differing = [name for name in first if first[name] != second[name]]
    assert differing == []


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_audio"])
def test_another_seed_changes_the_weights_only(model_dirs: ModelDirs, family: str) -> None:
    first = read_tree(model_dirs.tiny(family))
    other = read_tree(model_dirs.tiny(family, seed=1))
    differing = sorted(name for name in first if first[name] != other[name])
    assert differing == ["model.safetensors"]


def test_rebuilding_into_the_same_directory_overwrites(
    model_dirs: ModelDirs, tmp_path: Path
) -> None:
    out = build_tiny_model(tmp_path / "m", "qwen2_vl", seed=1)
    build_tiny_model(out, "qwen2_vl", seed=0)
    assert read_tree(out) == read_tree(model_dirs.tiny("qwen2_vl"))


HUB_LAYOUT = {
    # family: (top-level weight prefixes, lm_head, input embedding); None: tied to it
    "qwen2_vl": ({"model", "visual", "lm_head"}, "lm_head", "model.embed_tokens"),
    "qwen2_5_vl": ({"model", "visual", "lm_head"}, "lm_head", "model.embed_tokens"),
    "qwen2_audio": (
        {"audio_tower", "multi_modal_projector", "language_model"},
        "language_model.lm_head",
        "language_model.model.embed_tokens",
    ),
    "qwen3_vl": ({"model", "lm_head"}, "lm_head", "model.language_model.embed_tokens"),
    "llava_onevision": (
        {"vision_tower", "multi_modal_projector", "image_newline", "language_model"},
        "language_model.lm_head",
        "language_model.model.embed_tokens",
    ),
    "internvl": ({"model", "lm_head"}, "lm_head", "model.language_model.embed_tokens"),
    "gemma3": (
        {"vision_tower", "multi_modal_projector", "language_model"},
        None,
        "language_model.model.embed_tokens",
    ),
    "idefics3": ({"model", "lm_head"}, "lm_head", "model.text_model.embed_tokens"),
    "mistral3": ({"model", "lm_head"}, "lm_head", "model.language_model.embed_tokens"),
    "audioflamingo3": (
        {"audio_tower", "multi_modal_projector", "language_model"},
        "language_model.lm_head",
        "language_model.model.embed_tokens",
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_are_small_float32_in_the_hub_layout(model_dirs: ModelDirs, family: str) -> None:
    from safetensors import safe_open

    with safe_open(str(model_dirs.tiny(family) / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        tensors = {name: f.get_tensor(name) for name in names}
    assert {str(t.dtype) for t in tensors.values()} == {"torch.float32"}
    assert 500_000 < sum(t.numel() for t in tensors.values()) < 1_500_000
    prefixes, lm_head, embed = HUB_LAYOUT[family]
    assert {name.split(".")[0] for name in names} == prefixes
    assert not [n for n in names if ".model.model." in n or "language_model.language_model" in n]
    assert tuple(tensors[f"{embed}.weight"].shape) == (TINY_VOCAB, 128)
    if lm_head is None:  # tied (Gemma): stored once, as the embedding
        assert not [n for n in names if "lm_head" in n]
        return
    head = tensors[f"{lm_head}.weight"]
    assert tuple(head.shape) == (TINY_VOCAB, 128)
    assert 0.45 < float(head.std()) < 0.55  # wide logits: clear greedy margins
    assert not head.equal(tensors[f"{embed}.weight"])


@pytest.mark.parametrize("family", FAMILIES)
def test_config_matches_the_brief(model_dirs: ModelDirs, family: str) -> None:
    from transformers import AutoConfig

    path = model_dirs.tiny(family)
    config = AutoConfig.from_pretrained(path)
    text = config.text_config
    assert config.model_type == family
    assert (text.vocab_size, text.hidden_size, text.num_hidden_layers) == (TINY_VOCAB, 128, 2)
    assert (text.num_attention_heads, text.num_key_value_heads) == (2, 1)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert head_dim == 64  # a CPU attention head size
    assert text.intermediate_size == 256
    assert text.max_position_embeddings == 4096
    tied = family == "gemma3"  # every Gemma ties its embeddings
    assert getattr(config, "tie_word_embeddings", False) is tied
    if family in VL_FAMILIES:
        assert text.rope_parameters["mrope_section"] == [8, 12, 12]
        assert config.image_token_id == TINY_SPECIAL_TOKENS["<|image_pad|>"]
        assert config.video_token_id == TINY_SPECIAL_TOKENS["<|video_pad|>"]
        assert config.vision_start_token_id == TINY_SPECIAL_TOKENS["<|vision_start|>"]
        assert config.vision_end_token_id == TINY_SPECIAL_TOKENS["<|vision_end|>"]
        vision = config.vision_config
        assert (vision.depth, vision.patch_size, vision.spatial_merge_size) == (2, 14, 2)
        assert vision.temporal_patch_size == 2
        merged = vision.hidden_size if family == "qwen2_vl" else vision.out_hidden_size
        assert merged == text.hidden_size
    elif family == "qwen2_audio":
        assert config.audio_token_index == TINY_SPECIAL_TOKENS["<|AUDIO|>"]
        assert config.audio_config.d_model == 64
        assert config.audio_config.num_mel_bins == 128
    else:
        tower = getattr(config, "vision_config", None) or config.audio_config
        layers = getattr(tower, "num_hidden_layers", None) or tower.depth
        assert (layers, tower.hidden_size) == (2, 64)
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    assert text.eos_token_id in eos


# ---------------------------------------------------------------- tiny models: tokenizer, processor


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_tokenizer_is_exactly_the_vocab_with_fixed_special_ids(
    model_dirs: ModelDirs, family: str
) -> None:
    from transformers import AutoTokenizer

    path = model_dirs.tiny(family)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == text_config(read_config(path))["vocab_size"] == TINY_VOCAB
    assert {t: tok.convert_tokens_to_ids(t) for t in TINY_SPECIAL_TOKENS} == TINY_SPECIAL_TOKENS
    assert max(TINY_SPECIAL_TOKENS.values()) < 16  # low ids
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 0)

    ids = tok.encode("Describe this image.", add_special_tokens=False)
    assert 1 <= len(ids) <= 6
    assert all(i > max(TINY_SPECIAL_TOKENS.values()) for i in ids)
    text = "Zebra, 3.14 ü 漢字 <|im_start|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[-1] == TINY_SPECIAL_TOKENS["<|im_start|>"]
    assert tok.decode(ids) == text
    assert tok.chat_template is not None


@pytest.mark.parametrize("family", VL_FAMILIES)
def test_vl_processor_renders_the_template_and_caps_images_at_8_tokens(
    model_dirs: ModelDirs, family: str
) -> None:
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer

    path = model_dirs.tiny(family)
    processor = AutoProcessor.from_pretrained(path)
    prompt = processor.apply_chat_template(
        IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert prompt == EXPECTED_IMAGE_PROMPT
    tok = AutoTokenizer.from_pretrained(path)
    assert (
        tok.apply_chat_template(IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False)
        == prompt
    )

    image_pad = TINY_SPECIAL_TOKENS["<|image_pad|>"]
    # (width, height) -> tokens: 28x28 pixels per token, at least 1 and at most 8 tokens.
    sizes = {(10, 10): 1, (56, 56): 4, (448, 448): 4, (448, 56): 8, (1024, 700): 6}
    for size, expected in sizes.items():
        batch = processor(text=[prompt], images=[Image.new("RGB", size, (200, 30, 30))])
        assert batch["input_ids"][0].count(image_pad) == expected, size


def family_module(family: str) -> Any:
    import importlib

    return importlib.import_module(f"mmbatch.tiny_models.{family}")


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_other_tokenizers_hold_their_family_tokens_at_fixed_ids(
    model_dirs: ModelDirs, family: str
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dirs.tiny(family))
    special = family_module(family).SPECIAL_TOKENS
    assert len(tok) == TINY_VOCAB
    assert {t: tok.convert_tokens_to_ids(t) for t in special} == special
    assert tok.eos_token in special
    text = "Zebra, 3.14 ü 漢字\n\nok"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    if family == "gemma3":  # "\n".."\n\n\n\n" are whole ordinary tokens, kept by decoding
        assert tok.convert_tokens_to_ids("\n\n") == 9
        ids = tok.encode("a\n\nb", add_special_tokens=False)
        assert 9 in ids
        assert tok.decode(ids, skip_special_tokens=True) == "a\n\nb"


PLACEHOLDERS = {
    "llava_onevision": {"image": "<image>\n", "video": "<video>\n"},
    "internvl": {"image": "<IMG_CONTEXT>\n", "video": "<video>\n"},
    "gemma3": {"image": "<start_of_image>"},
    "idefics3": {"image": "<image>"},
    "mistral3": {"image": "[IMG]"},
    "audioflamingo3": {"audio": "<sound>"},
}


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_other_templates_place_the_family_placeholders_before_the_text(
    model_dirs: ModelDirs, family: str
) -> None:
    from transformers import AutoProcessor

    from mmbatch.engine.processor import chat_messages

    processor = AutoProcessor.from_pretrained(model_dirs.tiny(family))
    for modality, placeholder in PLACEHOLDERS[family].items():
        assert modality in FAMILY_MEDIA[family]
        messages = chat_messages("Be brief.", "Describe.", (modality,))
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert placeholder + "Describe." in prompt
        assert prompt.index("Be brief.") < prompt.index(placeholder)
        assert prompt.count(placeholder) == 1


def test_video_placeholder_renders(model_dirs: ModelDirs) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dirs.tiny("qwen2_vl"))
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Hi"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|video_pad|><|vision_end|>Hi<|im_end|>" in prompt
    assert processor.video_processor.size["longest_edge"] <= 4 * 28 * 28


def test_audio_processor_makes_25_tokens_per_second(model_dirs: ModelDirs) -> None:
    import numpy as np
    from transformers import AutoProcessor

    from mmbatch.tiny_models.qwen_audio import audio_token_count

    processor = AutoProcessor.from_pretrained(model_dirs.tiny("qwen2_audio"))
    prompt = processor.apply_chat_template(
        AUDIO_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert prompt == EXPECTED_AUDIO_PROMPT
    assert processor.feature_extractor.sampling_rate == 16_000
    for seconds, expected in [(1.0, 25), (2.0, 50), (0.5, 12)]:
        audio = np.zeros(int(16_000 * seconds), dtype=np.float32)
        batch = processor(text=[prompt], audio=[audio], sampling_rate=16_000)
        assert batch["input_ids"][0].count(TINY_SPECIAL_TOKENS["<|AUDIO|>"]) == expected
        assert audio_token_count(len(audio)) == expected


def test_transformers_loads_the_weights_without_missing_keys(model_dirs: ModelDirs) -> None:
    from transformers import Qwen2VLForConditionalGeneration

    model, info = Qwen2VLForConditionalGeneration.from_pretrained(
        model_dirs.tiny("qwen2_vl"), output_loading_info=True
    )
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert 0.45 < float(model.lm_head.weight.detach().std()) < 0.55


# ---------------------------------------------------------------- real shapes


@pytest.mark.parametrize("name", QWEN_REAL_SHAPES)
def test_real_shape_config_has_the_7b_dimensions(model_dirs: ModelDirs, name: str) -> None:
    from transformers import AutoConfig

    path = model_dirs.real(name)
    assert not list(path.glob("*.safetensors"))
    assert not list(path.glob("*.bin"))
    config = AutoConfig.from_pretrained(path)
    text = config.text_config
    assert config.model_type == name.removesuffix("_7b")
    assert (text.vocab_size, text.hidden_size, text.num_hidden_layers) == (152064, 3584, 28)
    assert (text.num_attention_heads, text.num_key_value_heads) == (28, 4)
    assert text.intermediate_size == 18944
    assert text.rope_parameters["mrope_section"] == [16, 24, 24]
    assert config.tie_word_embeddings is False
    for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        token = {
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
        }[key]
        assert getattr(config, key) == QWEN_SPECIAL_TOKENS[token]
    vision = config.vision_config
    assert vision.depth == 32
    if name == "qwen2_5_vl_7b":
        assert (vision.hidden_size, vision.out_hidden_size) == (1280, 3584)
        assert vision.fullatt_block_indexes == [7, 15, 23, 31]
        assert vision.window_size == 112
    else:
        assert (vision.embed_dim, vision.hidden_size) == (1280, 3584)


@pytest.mark.parametrize("name", QWEN_REAL_SHAPES)
def test_real_shape_builds_a_model_of_the_published_size(model_dirs: ModelDirs, name: str) -> None:
    import torch
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dirs.real(name))
    model_cls = getattr(transformers, config.architectures[0])
    with torch.device("meta"):  # shapes only: no memory, no weights
        model = model_cls(config)
    total = sum(p.numel() for p in model.parameters())
    visual = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    # Both 7B models are published as 8.29B parameters, about 0.68B of them in the vision tower.
    assert 8.28e9 < total < 8.30e9
    assert 0.67e9 < visual < 0.68e9


@pytest.mark.parametrize("name", QWEN_REAL_SHAPES)
def test_real_shape_tokenizer_and_processor(model_dirs: ModelDirs, name: str) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    path = model_dirs.real(name)
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    assert len(tok) == 152064
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    assert ids == QWEN_SPECIAL_TOKENS
    assert ids["<|endoftext|>"] == 151643
    assert ids["<|image_pad|>"] == 151655
    assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643)
    assert processor.image_processor.size["shortest_edge"] == 56 * 56
    assert processor.image_processor.size["longest_edge"] == 16384 * 28 * 28

    prompt = processor.apply_chat_template(
        IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert prompt == EXPECTED_IMAGE_PROMPT
    batch = processor(text=[prompt], images=[Image.new("RGB", (448, 448), (20, 120, 220))])
    assert batch["input_ids"][0].count(151655) == (448 // 28) ** 2 == 256
    assert batch["image_grid_thw"][0].tolist() == [1, 32, 32]
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]


def test_gemma3_4b_real_shape_has_the_published_size(model_dirs: ModelDirs) -> None:
    import torch
    import transformers
    from transformers import AutoConfig

    path = model_dirs.real("gemma3_4b")
    assert not list(path.glob("*.safetensors"))
    config = AutoConfig.from_pretrained(path)
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.intermediate_size) == (2560, 34, 10240)
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (8, 4, 256)
    assert text.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert text.sliding_window == 1024
    assert text.rope_parameters["full_attention"]["factor"] == 8.0
    assert (vision.hidden_size, vision.num_hidden_layers, vision.image_size) == (1152, 27, 896)
    assert config.mm_tokens_per_image == 256
    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config)
    # google/gemma-3-4b-it: 4,300,079,472 parameters, 416,866,032 of them in SigLIP.
    assert sum(p.numel() for p in model.parameters()) == 4_300_079_472
    vision_params = [p.numel() for n, p in model.named_parameters() if "vision_tower" in n]
    assert sum(vision_params) == 416_866_032


def test_gemma3_4b_real_shape_tokenizer_processor_and_vllm_config(model_dirs: ModelDirs) -> None:
    from budgets import budget_for
    from PIL import Image
    from transformers import AutoProcessor

    from mmbatch.engine.budget import ItemCount
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.vllm_settings import engine_args
    from mmbatch.tiny_models.real_shapes import GEMMA_SPECIAL_TOKENS

    path = model_dirs.real("gemma3_4b")
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    assert len(tok) == 262208
    assert {t: tok.convert_tokens_to_ids(t) for t in GEMMA_SPECIAL_TOKENS} == GEMMA_SPECIAL_TOKENS
    prompt = processor.apply_chat_template(
        IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("<bos><start_of_turn>user\n<start_of_image>Describe this image.")
    batch = processor(text=[prompt], images=[Image.new("RGB", (640, 480), (20, 120, 220))])
    assert batch["input_ids"][0].count(GEMMA_SPECIAL_TOKENS["<image_soft_token>"]) == 256

    # vLLM's configuration takes the directory as a benchmark would run it, without weights.
    settings = {"load_format": "dummy", "max_model_len": 8192}
    vllm_config = engine_args(EngineConfig(str(path), settings), {"image": 1})
    model_config = vllm_config.create_engine_config().model_config
    assert model_config.architectures == ["Gemma3ForConditionalGeneration"]
    assert model_config.max_model_len == 8192
    # And its processing info counts a picture as the real model takes it: 256 soft tokens,
    # written between <start_of_image> and <end_of_image> with newlines around them.
    counts = budget_for(path, 8192).counts
    assert counts.image(1280, 720) == counts.image(64, 64) == ItemCount(259, 256)


# ---------------------------------------------------------------- slow: the real vLLM CPU engine


@pytest.fixture
def one_engine_at_a_time() -> Iterator[None]:
    # In-process engine: same token ids as multiprocessing, ~7x faster to start, half the RAM.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    yield
    gc.collect()


def _generate_twice(model: Path, modality: str, prompt: str, items: list[Any]) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model),
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        limit_mm_per_prompt={modality: 1},
        seed=0,
    )
    try:
        sampling = SamplingParams(max_tokens=8, temperature=0.0)
        requests = [{"prompt": prompt, "multi_modal_data": {modality: item}} for item in items]
        runs = []
        for _ in range(2):
            outputs = llm.generate(requests, sampling, use_tqdm=False)
            runs.append([list(o.outputs[0].token_ids) for o in outputs])
            for output in outputs:
                assert output.outputs[0].finish_reason in ("length", "stop")
        assert runs[0] == runs[1], "greedy output changed between two runs in one engine"
        return runs[0]
    finally:
        del llm


@pytest.mark.slow
@pytest.mark.parametrize("family", VL_FAMILIES)
def test_vllm_generates_from_the_tiny_vl_model(
    model_dirs: ModelDirs, one_engine_at_a_time: None, family: str
) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        for h, w in [(64, 64), (120, 200), (448, 448)]
    ]
    tokens = _generate_twice(model_dirs.tiny(family), "image", EXPECTED_IMAGE_PROMPT, images)
    assert all(len(ids) > 0 for ids in tokens)
    assert all(0 <= i < TINY_VOCAB for ids in tokens for i in ids)


@pytest.mark.slow
def test_vllm_generates_from_the_tiny_audio_model(
    model_dirs: ModelDirs, one_engine_at_a_time: None
) -> None:
    import numpy as np

    t = np.arange(16_000, dtype=np.float32) / 16_000
    clips = [
        ((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16_000),
        ((0.1 * np.random.default_rng(0).standard_normal(32_000)).astype(np.float32), 16_000),
    ]
    tokens = _generate_twice(model_dirs.tiny("qwen2_audio"), "audio", EXPECTED_AUDIO_PROMPT, clips)
    assert all(len(ids) > 0 for ids in tokens)
    assert all(0 <= i < TINY_VOCAB for ids in tokens for i in ids)
