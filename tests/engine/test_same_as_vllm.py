"""What vLLM itself gives: a caption or a batch line cut at any length reads exactly as
vLLM's ``LLM.chat`` answers the same request, and a batch file's output lines are
``vllm run-batch``'s, field for field (log probabilities, ``stop_reason``), on the same tiny
model.

A cut can fall inside a character that the tokenizer spreads over several byte tokens. vLLM's
detokenizer holds such an incomplete tail back; decoding the token ids ourselves gave a
U+FFFD there instead (``' city ship brownhing\\ufffd'`` where ``vllm run-batch``
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
    from mmbatch import RunConfig, caption

    differ = []
    for picture in pictures:
        for k in CUTS:
            [row] = caption(
                str(picture),
                engine=uncached_vl_engine,
                prompt=PROMPT,
                sampling=Sampling(max_tokens=k),
                run=RunConfig(progress=False),
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


def run_batch_module() -> str:
    """``vllm run-batch``'s module (the ``vllm`` command itself needs the package's metadata,
    which vLLM's CPU build names otherwise); 0.26 kept it under ``entrypoints.openai``."""
    import importlib.util

    new = "vllm.entrypoints.launchers.run_batch"
    return new if importlib.util.find_spec(new) else "vllm.entrypoints.openai.run_batch"


def test_batch_lines_are_vllm_run_batchs_lines(  # type: ignore[no-untyped-def]
    uncached_vl_engine, tiny_vl_model: Path, pictures: list[Path], tmp_path: Path
) -> None:
    """One batch file through ``vllm run-batch`` and through ``mmbatch run-openai-batch``:
    each line's body is the same, key for key (log probabilities within float rounding),
    but for the ids, the time, vLLM's server fingerprint and the cached prompt tokens,
    which only mmbatch counts."""
    import os
    import subprocess
    import sys

    from mmbatch.cli import build_parser, openai_batch

    def entry(custom_id: str, picture: Path, **body: Any) -> dict[str, Any]:
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": str(tiny_vl_model), "messages": user_message(picture), **body},
        }

    first, second = pictures
    requests = tmp_path / "requests.jsonl"
    lines = [
        entry("top3", first, max_completion_tokens=6, temperature=0, logprobs=True, top_logprobs=3),
        entry("chosen", second, max_tokens=4, temperature=0, logprobs=True),
        entry("cut", first, max_completion_tokens=5, temperature=0),
        entry("stop", first, max_completion_tokens=20, temperature=0, stop=["ship"]),
    ]
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    theirs = tmp_path / "run_batch.jsonl"
    log = tmp_path / "run_batch.log"
    argv = [sys.executable, "-m", run_batch_module(), "-i", str(requests), "-o", str(theirs)]
    engine = ["--model", str(tiny_vl_model), "--dtype", "float32", "--max-model-len", "1024"]
    with log.open("w") as out:
        done = subprocess.run(
            [*argv, *engine, "--enforce-eager", "--block-size", "32"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"},
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, log.read_text()[-3000:]
    ours = tmp_path / "results.jsonl"
    mmbatch = ["run-openai-batch", str(requests), "--model", str(tiny_vl_model), "--out", str(ours)]
    assert openai_batch.run(build_parser().parse_args(mmbatch), uncached_vl_engine) == 0

    def bodies(path: Path) -> dict[str, dict[str, Any]]:
        found = {}
        for row in map(json.loads, path.read_text().splitlines()):
            assert (row["error"], row["response"]["status_code"]) == (None, 200)
            body = row["response"]["body"]
            for key in ("id", "created", "system_fingerprint"):
                body.pop(key)
            body["usage"].pop("prompt_tokens_details")
            found[row["custom_id"]] = body
        return found

    theirs_bodies, our_bodies = bodies(theirs), bodies(ours)
    assert (
        sorted(our_bodies) == sorted(theirs_bodies) == sorted(line["custom_id"] for line in lines)
    )
    for custom_id, body in our_bodies.items():
        assert body == approx_logprobs(theirs_bodies[custom_id]), custom_id
    # What this compares is there: tokens with their alternatives, and a stop string.
    top3 = our_bodies["top3"]["choices"][0]["logprobs"]["content"]
    assert len(top3) == 6
    assert all(len(token["top_logprobs"]) == 3 for token in top3)
    assert our_bodies["chosen"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    assert our_bodies["stop"]["choices"][0]["stop_reason"] == "ship"
    assert our_bodies["cut"]["choices"][0]["logprobs"] is None


def approx_logprobs(value: Any) -> Any:
    """``value`` with its log probabilities compared within float rounding (the two engines
    batch the same requests differently)."""
    if isinstance(value, dict):
        return {
            k: pytest.approx(v, abs=1e-4) if k == "logprob" else approx_logprobs(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [approx_logprobs(v) for v in value]
    return value
