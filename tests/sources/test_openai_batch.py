"""OpenAI batch files: reading the input format, writing the output format (fake engine)."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine, expected_text

from mmbatch.errors import SourceError
from mmbatch.jobs import Job, run_in_memory
from mmbatch.openai_batch.reader import read_batch
from mmbatch.openai_batch.writer import OpenAIBatchShape
from mmbatch.pipeline import RunConfig
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import Request, Result, Sampling, TokenLogprob, Turn, Usage


def refused_line(request: Request) -> dict[str, Any]:
    """The output line of a request refused while its batch file was read."""
    row = OpenAIBatchShape("m").add(request, (), Result(request.id, error=request.error))
    return row.data


def line(custom_id: str, *content: Any, **body: Any) -> dict[str, Any]:
    parts = [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": parts}], **body},
    }


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def data_uri(path: Path) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()


def write(tmp_path: Path, *lines: dict[str, Any] | str) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_lines_become_requests(tmp_path: Path, samples: Path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "s.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    system = {"role": "system", "content": "Be brief."}
    first = line("c1", image(data_uri(samples / "sunset.jpg")), "What is it?", max_tokens=7)
    first["body"]["messages"].insert(0, system)
    batch = read_batch(
        write(
            tmp_path,
            first,
            line(
                "c2",
                "Describe",
                image("pics/s.jpg"),
                image(f"file://{samples / 'checkerboard.png'}"),
                "as JSON.",
                max_completion_tokens=9,
                temperature=0,
                seed=4,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
            ),
            line("c3", "Just text.", response_format={"type": "json_object"}),
        ),
        default_max_tokens=33,
        paths=LocalPaths((str(samples),)),  # the samples lie outside the file's folder
    )
    assert batch.refused == 0
    assert batch.max_images == 2
    c1, c2, c3 = batch.requests
    assert (c1.id, c1.system, c1.prompt) == ("c1", "Be brief.", "What is it?")
    assert c1.media[0].data == (samples / "sunset.jpg").read_bytes()
    # Left out: the model's generation_config, else vLLM's default (1.0, the hosted API's).
    assert c1.sampling == Sampling(max_tokens=7, temperature=None)
    assert c2.prompt == "Describe\nas JSON."
    assert [m.source for m in c2.media] == [
        str(tmp_path / "pics" / "s.jpg"),
        str(samples / "checkerboard.png"),
    ]
    assert c2.sampling is not None
    assert (c2.sampling.max_tokens, c2.sampling.temperature, c2.sampling.seed) == (9, 0, 4)
    assert json.loads(c2.sampling.json_schema or "") == schema
    assert c3.media == ()
    assert c3.sampling is not None
    assert c3.sampling.max_tokens == 33
    assert json.loads(c3.sampling.json_schema or "") == {"type": "object"}


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({**line("x", "hi"), "url": "/v1/embeddings"}, "url '/v1/embeddings' is not supported"),
        ({**line("x", "hi"), "method": "GET"}, "method 'GET'"),
        (line("x", "hi", n=0), "n must be an integer >= 1, got 0"),
        (line("x", "hi", stop=[1]), "stop must be a string or a list of strings"),
        (line("x", "hi", top_p=0), "top_p must be in (0, 1], got 0"),
        (line("x", "hi", stream=True), "streaming"),
        (
            line(
                "x",
                "hi",
                tools=[{"type": "function", "function": {"name": "f"}}],
                logit_bias={"7": 1.0},
            ),
            "unsupported parameter(s): 'logit_bias', 'tools'",
        ),
        (line("x", "hi", frobnicate=1), "unsupported parameter(s): 'frobnicate'"),
        (
            line("x", "hi", **{f"p{i:02}": 1 for i in range(30)}),
            "unsupported parameter(s): 'p00', 'p01', 'p02', 'p03', 'p04', 'p05', 'p06', 'p07', "
            "'p08', 'p09', ... and 20 more",
        ),
        (line("x", "hi", top_logprobs=2), "`logprobs` must be set to true"),
        (line("x", "hi", top_logprobs=-2, logprobs=True), "`top_logprobs` must be a positive"),
        (line("x", "hi", temperature="warm"), "temperature must be a number"),
        (line("x", "hi", max_tokens=1.5), "max_tokens must be an integer"),
        (line("x", "hi", max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
        (
            line("x", image("https://example.com/a.jpg")),
            "x#image0: 'https://example.com/a.jpg' is a URL; URLs are fetched only with "
            "--allow-urls (which bounds each download in size and time)",
        ),
        (line("x", image("data:image/png;base64,@@@")), "not valid base64"),
        (line("x", image("data:image/png,raw")), "must be base64"),
        (line("x", {"type": "input_audio"}), "is not supported (text, image_url)"),
        (line("x"), "the user message is empty"),
        (line("x", "hi", response_format={"type": "grammar"}), "response_format"),
        (
            line("x", "hi", response_format={"type": "json_schema", "json_schema": {}}),
            "must be a table/object",
        ),
        (
            line(
                "x",
                "hi",
                response_format={
                    "type": "json_schema",
                    "json_schema": {"schema": {"$ref": "http://127.0.0.1:9/s.json"}},
                },
            ),
            "$ref 'http://127.0.0.1:9/s.json' leaves the schema",
        ),
    ],
)
def test_lines_we_cannot_serve_get_a_400_row(
    tmp_path: Path, entry: dict[str, Any], reason: str
) -> None:
    batch = read_batch(write(tmp_path, entry, line("ok", "fine")))
    assert [(r.id, r.error is None) for r in batch.requests] == [("x", False), ("ok", True)]
    assert batch.refused == 1
    row = refused_line(batch.requests[0])
    assert row["custom_id"] == "x"
    assert row["error"] is None
    response = row["response"]
    assert response["status_code"] == 400
    assert response["body"]["error"]["type"] == "invalid_request_error"
    assert reason in response["body"]["error"]["message"]


def test_sampling_extras_and_several_choices_are_served(tmp_path: Path) -> None:
    extras = {
        "n": 3,
        "stop": "\n",
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.05,
        "temperature": 0.7,
        "seed": 1,
    }
    [request] = read_batch(write(tmp_path, line("x", "hi", **extras))).requests
    assert request.error is None
    assert request.sampling == Sampling(
        max_tokens=1024,
        temperature=0.7,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.05,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        stop=("\n",),
        n=3,
        seed=1,
    )
    job = Job([request], shape=OpenAIBatchShape("m"))
    [row], _ = run_in_memory(job, FakeEngine(), RunConfig(progress=False))
    body = row["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in body["choices"]]
    assert texts == [f"{expected_text([], 'hi')}#{i}" for i in range(3)]
    assert body["usage"]["completion_tokens"] == sum(map(len, texts))


def test_logprobs_lines_ask_the_engine_for_them(tmp_path: Path) -> None:
    """As vLLM's request asks its engine: ``top_logprobs`` alternatives with ``logprobs``
    on (none given: the chosen token alone), nothing with it off; parameters vLLM's model
    reads leniently (``"0.5"``) are its values."""
    lines = [
        line("top", "hi", logprobs=True, top_logprobs=3),
        line("chosen", "hi", logprobs=True),
        line("off", "hi", logprobs=False, top_logprobs=0),
        line("null", "hi", logprobs=True, top_logprobs=None, temperature="0.5"),
    ]
    batch = read_batch(write(tmp_path, *lines))
    assert batch.refused == 0
    samplings = [r.sampling for r in batch.requests]
    assert [s.logprobs if s else "?" for s in samplings] == [3, 0, None, 0]
    assert samplings[3] is not None
    assert samplings[3].temperature == 0.5


def test_log_probabilities_are_written_as_vllms_server_writes_them() -> None:
    """Each token with the first ``top_logprobs`` of its step's candidates (the chosen
    first; -1: all), no log probability below -9999, the chosen token's bytes as decoded."""
    candidates = (TokenLogprob(" a", -0.1), TokenLogprob(" b", -2.0), TokenLogprob("", -math.inf))
    tokens = (
        TokenLogprob(" a", -0.1, (32, 97), candidates),
        TokenLogprob("\ufffd", -math.inf, None),  # a chosen token vLLM sent no step for
    )
    result = Result("r", " a", "length", Usage(3, 2), stop_reason=None, logprobs=tokens)
    for top, kept in ((0, []), (2, [" a", " b"]), (-1, [" a", " b", ""])):
        request = Request("r", "p", sampling=Sampling(logprobs=top))
        body = OpenAIBatchShape("m").add(request, (), result).data["response"]["body"]
        (choice,) = body["choices"]
        first, second = choice["logprobs"]["content"]
        assert (first["token"], first["logprob"], first["bytes"]) == (" a", -0.1, [32, 97])
        assert [t["token"] for t in first["top_logprobs"]] == kept
        assert [t["bytes"] for t in first["top_logprobs"]] == [list(t.encode()) for t in kept]
        assert (second["logprob"], second["bytes"], second["top_logprobs"]) == (-9999.0, None, [])
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    unasked = OpenAIBatchShape("m").add(Request("r", "p", sampling=Sampling()), (), result)
    assert unasked.data["response"]["body"]["choices"][0]["logprobs"] is None


def test_a_conversation_keeps_its_turns_and_their_images(tmp_path: Path, samples: Path) -> None:
    entry = line("x", image(str(samples / "sunset.jpg")), "What is this?")
    entry["body"]["messages"] = [
        {"role": "system", "content": "Be brief."},
        *entry["body"]["messages"],
        {"role": "assistant", "content": [{"type": "text", "text": "A sunset."}]},
        {
            "role": "user",
            "content": [image(str(samples / "checkerboard.png")), {"type": "text", "text": "And?"}],
        },
    ]
    [request] = read_batch(write(tmp_path, entry), paths=LocalPaths((str(samples),))).requests
    assert request.error is None
    assert (request.system, request.prompt) == ("Be brief.", "And?")
    assert request.history == (
        Turn("user", "What is this?", 1),
        Turn("assistant", "A sunset.", 0),
    )
    assert [Path(m.source).name for m in request.media] == ["sunset.jpg", "checkerboard.png"]


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "last message"),
        ([{"role": "tool", "content": "a"}], "role 'tool' is not supported"),
        (
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            "must come before",
        ),
    ],
)
def test_conversations_we_cannot_answer_are_refused(
    tmp_path: Path, messages: list[dict[str, Any]], reason: str
) -> None:
    entry = line("x", "hi")
    entry["body"]["messages"] = messages
    [refused] = read_batch(write(tmp_path, entry)).requests
    assert reason in refused_line(refused)["response"]["body"]["error"]["message"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], "not valid JSON"),
        (["[1, 2]"], "expected a JSON object"),
        ([{"method": "POST"}], "no 'custom_id'"),
        ([line("a", "x"), line("a", "y")], "custom_id 'a' is used twice"),
        (["", "  "], "holds no requests"),
    ],
)
def test_a_malformed_file_is_refused_whole(tmp_path: Path, lines: list, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        read_batch(write(tmp_path, *lines))


def test_output_lines_through_the_pipeline(tmp_path: Path, samples: Path) -> None:
    sunset = data_uri(samples / "sunset.jpg")
    batch = read_batch(
        write(
            tmp_path,
            line("a", image(sunset), "one", temperature=0),
            line("b", image(str(samples / "sunset_copy.jpg")), "two", temperature=0),
            line("c", image(str(samples / "truncated.jpg")), "three"),
            line("d", image(str(samples / "missing.jpg")), "four"),
        ),
        paths=LocalPaths((str(samples),)),
    )
    job = Job(batch.requests, shape=OpenAIBatchShape("tiny"))
    lines, stats = run_in_memory(
        job, FakeEngine(per_step=1, capacity=10), RunConfig(progress=False)
    )
    rows = {row["custom_id"]: row for row in lines}
    assert sorted(rows) == ["a", "b", "c", "d"]
    assert stats.decodes == 1  # the inline sunset and the file copy share one key
    for custom_id, prompt in (("a", "one"), ("b", "two")):
        row = rows[custom_id]
        assert row["id"].startswith("batch_req_")
        assert row["error"] is None
        response = row["response"]
        assert response["status_code"] == 200
        body = response["body"]
        assert body["object"] == "chat.completion"
        assert body["model"] == "tiny"
        (choice,) = body["choices"]
        assert choice["message"]["role"] == "assistant"
        # The same picture inline and as a file has one media key, hence the same answer.
        key = choice["message"]["content"].split("|")[0]
        assert choice["message"]["content"] == expected_text([key], prompt)
        assert choice["finish_reason"] == "stop"
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert "cached_tokens" in usage["prompt_tokens_details"]
    assert (
        rows["a"]["response"]["body"]["choices"][0]["message"]["content"].split("|")[0]
        == (rows["b"]["response"]["body"]["choices"][0]["message"]["content"].split("|")[0])
    )
    for custom_id, stage, kind in (("c", "decode", "corrupt"), ("d", "load", "unreadable")):
        response = rows[custom_id]["response"]
        assert response["status_code"] == 400
        assert response["body"]["error"]["stage"] == stage
        assert response["body"]["error"]["code"] == kind
        # Read back, a line says how its request went: what resume and the summary count.
        outcome = job.shape.outcome(rows[custom_id])
        assert outcome.error is not None
        assert (outcome.request_id, outcome.error.stage, outcome.error.kind) == (
            custom_id,
            stage,
            kind,
        )
    assert job.shape.outcome(rows["a"]).ok
