"""Offline Qwen-style tokenizers: a tiny trained byte-level BPE, padded to an exact vocabulary.

Nothing here downloads anything. :func:`train_bpe` trains a byte-level BPE with the
``tokenizers`` library on :data:`CORPUS`, a small English text built into this module, with
Qwen2's pre-tokenizer, normalizer and decoder, so ordinary prompts ("Describe this image.")
become a handful of tokens and every byte string stays encodable. :func:`build_tokenizer`
then lays the vocabulary out exactly as a model config needs it:

* the special tokens at the ids asked for (low ids for the tiny models, Qwen's real
  151643.. for the real-shape directories), as special added tokens;
* the trained tokens in training order in the free ids;
* unreachable filler tokens (``<|reserved_N|>``) in every id left, so that
  ``len(tokenizer) == vocab_size`` exactly.

:func:`wrap_tokenizer` wraps the result as ``PreTrainedTokenizerFast`` (eos ``<|im_end|>``, pad
``<|endoftext|>``) with the chat template; the processor that holds it saves it. Heavy imports
stay inside functions.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mmbatch.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

# Qwen2's pre-tokenizer split pattern (from its tokenizer.json).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# The tiny models' special tokens, at fixed low ids (shared by all three families).
TINY_SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<|vision_start|>": 3,
    "<|vision_end|>": 4,
    "<|vision_pad|>": 5,
    "<|image_pad|>": 6,
    "<|video_pad|>": 7,
    "<|audio_bos|>": 8,
    "<|audio_eos|>": 9,
    "<|AUDIO|>": 10,
}

# Qwen2 / Qwen2-VL / Qwen2.5-VL's real special tokens and ids.
QWEN_SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
}

# A small, fixed English corpus: prompts of the kind the toolkit sends plus plain prose, so
# that common words get their own tokens. Changing it changes every generated tokenizer.
CORPUS = """\
Describe this image. Describe this image in detail. Describe the image in one sentence.
Describe this video. Describe what happens in the video. Describe this audio clip.
What is in this image? What is in the picture? What is shown in the photo?
What is happening in this video? What do you hear in this audio? What's that sound?
Transcribe the audio. Transcribe the speech in this recording. Summarize the video.
Write a short caption for this image. Write a detailed caption for the picture.
Give a one-line caption. Caption this photo. List the objects you can see.
How many people are in the image? What color is the car? Where was this photo taken?
Answer in JSON. Return a JSON object with the keys "caption", "objects" and "tags".
Read the text in the image. Is there any text in the picture? Count the animals.
You are a helpful assistant. Please answer the question about the image.
The image shows a dog sitting on the grass next to a red ball.
The picture shows a city street at night with cars, lights and tall buildings.
A cat is sleeping on a sofa near a window. The sun is shining through the window.
Two people are walking along the beach. The sea is calm and the sky is blue.
A man is riding a bicycle down a country road between green fields.
A woman is reading a book in a library. There are many shelves full of books.
A group of children are playing football in a park on a sunny afternoon.
The video shows a chef cooking pasta in a small kitchen. He adds salt and stirs the pot.
The audio is a recording of a person speaking. Birds are singing in the background.
There is music playing, and then a door opens and closes. A phone is ringing.
The sound of rain on a roof, thunder in the distance, and wind in the trees.
A white boat is sailing on a lake surrounded by mountains covered with snow.
A bowl of fruit on a wooden table: apples, oranges, bananas and grapes.
The photo was taken in the morning. The light is soft and the colors are warm.
An old building with a clock tower stands in the center of the town square.
A train is arriving at the station. People are waiting on the platform.
The scene is indoors. The room has white walls, a lamp, a desk and a chair.
This is a black and white photo of a street in an old European city.
The chart shows sales by month. The numbers go up from January to December.
The document is a receipt from a shop. The total is 42 dollars and 10 cents.
There are three birds on a wire, one large tree, and a small house with a green door.
In the first second a car passes by; in the next seconds nothing moves.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Yes. No. Maybe. I don't know. It is not clear from the image.
one two three four five six seven eight nine ten hundred thousand
left right top bottom front back above below inside outside near far
red orange yellow green blue purple pink brown black white gray gold silver
person people man woman child boy girl baby dog cat bird horse cow sheep fish
car bus truck bike train plane boat ship road street bridge house building
tree flower grass sky cloud sun moon star water river lake sea beach mountain
table chair bed sofa door window wall floor kitchen room office shop market
small large big little tall short long old new young happy sad bright dark
is are was were be been being have has had do does did will would can could
the a an this that these those and or but with without of in on at to from by
"""


def train_bpe(vocab_size: int, corpus: str = CORPUS) -> tuple[dict[str, int], list[str]]:
    """Train a Qwen2-style byte-level BPE; return (vocab token -> id, merges "a b")."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = _qwen_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Fixed input order, single trainer; the output was checked to be byte-identical across
    # processes, PYTHONHASHSEED values and thread counts (tests compare whole builds).
    tokenizer.train_from_iterator(corpus.splitlines(), trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


def build_tokenizer(
    vocab_size: int,
    special_tokens: Mapping[str, int],
    *,
    trained_size: int | None = None,
    plain_tokens: Mapping[str, int] | None = None,
) -> Any:
    """A ``tokenizers.Tokenizer`` of exactly ``vocab_size`` ids, ``special_tokens`` at their ids.

    ``plain_tokens`` are added at their ids too, as ordinary (not special) tokens that decoding
    keeps: Gemma's vocabulary holds ``"\\n"`` and ``"\\n\\n"`` as whole tokens, and vLLM's
    Gemma 3 processor looks them up. ``trained_size`` caps how many tokens BPE training may
    produce (default: all ids not taken, capped at 4096, since the corpus cannot fill more).
    """
    from tokenizers import Tokenizer

    fixed = {**special_tokens, **(plain_tokens or {})}
    ids = sorted(fixed.values())
    if len(fixed) != len(special_tokens) + len(plain_tokens or {}) or (
        len(set(ids)) != len(ids) or (ids and (ids[0] < 0 or ids[-1] >= vocab_size))
    ):
        raise ConfigError(
            f"special token ids must be distinct and below vocab_size={vocab_size}: {fixed}"
        )
    free = vocab_size - len(fixed)
    if trained_size is None:
        trained_size = min(free, 4096)
    if trained_size > free or trained_size < 256:
        raise ConfigError(
            f"cannot fit a byte-level BPE of {trained_size} tokens into vocab_size={vocab_size}"
        )

    trained_vocab, merges = train_bpe(trained_size)
    vocab = _place_ids(trained_vocab, fixed, vocab_size)
    spec = _tokenizer_spec(vocab, merges, special_tokens, plain_tokens or {})
    return Tokenizer.from_str(json.dumps(spec))


def _place_ids(
    trained_vocab: Mapping[str, int], special_tokens: Mapping[str, int], vocab_size: int
) -> dict[str, int]:
    """Every id below ``vocab_size``: the special tokens at theirs, the trained tokens in
    their order on the free ids, reserved fillers on the rest."""
    by_id = {i: tok for tok, i in trained_vocab.items()}
    trained_tokens = [by_id[i] for i in sorted(by_id)]

    taken = set(special_tokens.values())
    free_ids = (i for i in range(vocab_size) if i not in taken)
    vocab: dict[str, int] = {}
    for tok in trained_tokens:
        vocab[tok] = next(free_ids)
    for filler, i in enumerate(free_ids):
        vocab[f"<|reserved_{filler}|>"] = i
    for tok, i in special_tokens.items():
        vocab[tok] = i
    if len(vocab) != vocab_size:  # pragma: no cover (a trained token named like a special one)
        raise ConfigError(f"tokenizer layout produced {len(vocab)} ids, expected {vocab_size}")
    return vocab


def _tokenizer_spec(
    vocab: Mapping[str, int],
    merges: list[str],
    special_tokens: Mapping[str, int],
    plain_tokens: Mapping[str, int],
) -> dict[str, Any]:
    """The ``tokenizer.json`` of a byte-level BPE over ``vocab``, pre-tokenised as Qwen's."""
    added = {**special_tokens, **plain_tokens}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": tok in special_tokens,
            }
            for tok, i in sorted(added.items(), key=lambda kv: kv[1])
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": json.loads(_qwen_pre_tokenizer_json()),
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
            "merges": merges,
        },
    }


def wrap_tokenizer(
    tokenizer_object: Any,
    *,
    chat_template: str,
    model_max_length: int,
    eos: str = EOS_TOKEN,
    pad: str = PAD_TOKEN,
    bos: str | None = None,
    named: Mapping[str, str] | None = None,
) -> Any:
    """As ``PreTrainedTokenizerFast`` with the chat template: eos ``<|im_end|>`` and pad
    ``<|endoftext|>`` unless told otherwise. ``named`` gives special tokens a name the
    model's processor reads (Gemma 3's ``boi_token``, InternVL's ``context_image_token``)."""
    from transformers import PreTrainedTokenizerFast

    kwargs: dict[str, Any] = {"eos_token": eos, "pad_token": pad}
    if bos is not None:
        kwargs["bos_token"] = bos
    if named:
        kwargs["extra_special_tokens"] = dict(named)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )
    tok.chat_template = chat_template
    return tok


def _qwen_pre_tokenizer_json() -> str:
    return json.dumps(
        {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_SPLIT_PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        }
    )


def _qwen_pre_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


__all__ = [
    "CORPUS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "QWEN_SPECIAL_TOKENS",
    "TINY_SPECIAL_TOKENS",
    "build_tokenizer",
    "train_bpe",
    "wrap_tokenizer",
]
