"""The texts are vLLM's own: a caption or a batch line cut at any length reads exactly as
vLLM's ``LLM.chat`` answers the same request, on the same tiny model.

A cut can fall inside a character that the tokenizer spreads over several byte tokens. vLLM's
detokenizer holds such an incomplete tail back; decoding the token ids ourselves gave a
U+FFFD there instead (issue 26: ``' city ship brownhing\\ufffd'`` where ``vllm run-batch``
gives ``' city ship brownhing'``). The pictures are small enough that neither side resizes
them, so both see the same pixels and generate the same tokens.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mmbatch.types import Sampling

pytestmark = pytest.mark.slow

CUTS = range(1, 25)
PROMPT = "What is in the picture?"
SIDE = 56
"""Pixels a side: under the tiny processor's pixel limit and a multiple of its patch, so the
picture reaches the model as it is, on both sides."""


def noise_picture(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    picture = Image.new("RGB", (SIDE, SIDE))
    pixels = [tuple(rng.randrange(256) for _ in range(3)) for _ in range(SIDE * SIDE)]
    picture.putdata(pixels)
    picture.save(path)
    return path


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def user_message(picture: Path) -> list[dict[str, Any]]:
    content = [
        {"type": "image_url", "image_url": {"url": data_uri(picture)}},
        {"type": "text", "text": PROMPT},
    ]
    return [{"role": "user", "content": content}]


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    # Seeds whose answers split a character at some cuts (checked below).
    folder = tmp_path_factory.mktemp("noise")
    return [noise_picture(folder / f"noise{seed}.png", seed) for seed in (1, 2)]


@pytest.fixture(scope="module")
def vllm_texts(uncached_vl_engine, pictures: list[Path]) -> dict[tuple[str, int], str]:  # type: ignore[no-untyped-def]
    """vLLM's own answer to each picture at each cut: ``LLM.chat``, as ``vllm run-batch``
    serves a batch line (the tiny model's generation_config sets no sampling defaults)."""
    from vllm import SamplingParams

    llm = uncached_vl_engine.llm
    tokenizer = llm.get_tokenizer()
    texts = {}
    split = []
    for picture in pictures:
        outputs = llm.chat(
            [user_message(picture)] * len(CUTS),
            [SamplingParams(max_tokens=k, temperature=0) for k in CUTS],
            use_tqdm=False,
        )
        for k, output in zip(CUTS, outputs, strict=True):
            (completion,) = output.outputs
            assert len(completion.token_ids) == k  # no end of text before the cut
            texts[picture.name, k] = completion.text
            if tokenizer.decode(completion.token_ids, skip_special_tokens=True).endswith("\ufffd"):
                split.append((picture.name, k))
    # The cuts this test relies on: some end inside a character (else it could not fail).
    assert len(split) >= 2, split
    return texts


def test_captions_cut_at_any_length_are_vllms_text(  # type: ignore[no-untyped-def]
    uncached_vl_engine, pictures: list[Path], vllm_texts: dict[tuple[str, int], str]
) -> None:
    from mmbatch import caption

    differ = []
    for picture in pictures:
        for k in CUTS:
            [row] = caption(
                str(picture),
                engine=uncached_vl_engine,
                prompt=PROMPT,
                sampling=Sampling(max_tokens=k),
                progress=False,
            )
            assert row["error"] is None
            if row["text"] != vllm_texts[picture.name, k]:
                differ.append((picture.name, k, row["text"], vllm_texts[picture.name, k]))
    assert differ == []


def test_batch_lines_cut_at_any_length_are_vllms_text(  # type: ignore[no-untyped-def]
    uncached_vl_engine,
    tiny_vl_model: Path,
    pictures: list[Path],
    vllm_texts: dict[tuple[str, int], str],
    tmp_path: Path,
) -> None:
    from mmbatch.cli import build_parser, openai_batch

    requests = tmp_path / "requests.jsonl"
    lines = [
        {
            "custom_id": f"{picture.name}@{k}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny",
                "messages": user_message(picture),
                "max_completion_tokens": k,
                "temperature": 0,
            },
        }
        for picture in pictures
        for k in CUTS
    ]
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    argv = ["run-openai-batch", str(requests), "--model", str(tiny_vl_model), "--out", str(out)]
    assert openai_batch.run(build_parser().parse_args(argv), uncached_vl_engine) == 0
    differ = []
    for row in map(json.loads, out.read_text().splitlines()):
        name, k = row["custom_id"].split("@")
        text = row["response"]["body"]["choices"][0]["message"]["content"]
        if text != vllm_texts[name, int(k)]:
            differ.append((row["custom_id"], text, vllm_texts[name, int(k)]))
    assert differ == []
