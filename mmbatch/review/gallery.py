"""The review gallery: one self-contained HTML page to look at a job's results.

One card per output row (its thumbnail, what was asked, the text or the error with its
stage, a clip's or an audio window's span), the job summary on top (counts, throughput,
cache hit rates, from ``OUT.summary.json``), a filter for errors and a search box that keeps
the cards whose text (answer, id, source, prompt, error) holds what is typed. Everything is
inline (pictures as ``data:`` URIs, the style and the few lines of script), so the page can
be mailed or archived as one file and opens without a network. The filter also reads the
URL's fragment (``#errors``, ``#ok``), so a link can open the page already filtered.

The page fits any width, a phone's included: a long unbroken answer (a URL, a hash, a run
of one character) wraps anywhere rather than widening its card or the page.

Every value from the rows is escaped: captions are model output and file names are user
input, and neither may turn into markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from mmbatch.output.summary import time_split
from mmbatch.row_schema import FLAT_COLUMNS, RECIPE_COLUMNS
from mmbatch.words import counted

KNOWN_FIELDS = frozenset(column.name for column in FLAT_COLUMNS + RECIPE_COLUMNS)
"""Fields shown in a card's body; any other field of a row is listed under "more"."""


def render(
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None,
    preview: Callable[[Mapping[str, Any]], str],
    title: str,
) -> str:
    """The page for ``rows``. ``preview(row)`` gives a thumbnail URI or raises ``NoPreview``."""
    failed = sum(1 for row in rows if row.get("error"))
    cards = "\n".join(_card(index, row, preview) for index, row in enumerate(rows))
    return _PAGE.format(
        title=escape(title),
        summary=_summary(summary, rows),
        total=len(rows),
        failed=failed,
        ok=len(rows) - failed,
        cards=cards,
        style=_STYLE,
        script=_SCRIPT,
    )


def _card(index: int, row: Mapping[str, Any], preview: Callable[[Mapping[str, Any]], str]) -> str:
    error = row.get("error")
    status = "error" if error else "ok"
    stage, message = _error_parts(error) if error else ("", "")
    try:
        picture = f'<img src="{preview(row)}" alt="preview of {escape(str(row.get("id")))}">'
    except Exception as reason:  # NoPreview, or anything else: a preview never stops the page
        why = str(reason)
        # The row's error says it already (the picture the job could not decode either).
        shown = "no preview" if message and message in why else f"no preview: {why}"
        picture = f'<div class="nopreview">{escape(shown)}</div>'
    if error:
        outcome = (
            f'<p class="error"><span class="stage">{escape(stage)}</span> {escape(message)}</p>'
        )
    else:
        text = row.get("text")
        texts = text if isinstance(text, list) else [text]  # n answers: one paragraph each
        outcome = "".join(f'<p class="text">{escape(str(t or ""))}</p>' for t in texts)
    if isinstance(row.get("outputs"), Mapping):  # a recipe's row: every answer by name
        outcome += "".join(_answer(name, answer) for name, answer in row["outputs"].items())
    tokens = (
        f"{row.get('prompt_tokens', 0)} prompt ({row.get('cached_tokens', 0)} cached), "
        f"{row.get('output_tokens', 0)} output tokens"
        + (f", {row['finish_reason']}" if row.get("finish_reason") else "")
    )
    extra = {k: v for k, v in row.items() if k not in KNOWN_FIELDS}
    more = (
        "<details><summary>more</summary><pre>"
        + escape(json.dumps(extra, indent=2, ensure_ascii=False, default=str))
        + "</pre></details>"
        if extra
        else ""
    )
    return (
        f'<article class="item {status}" data-status="{status}" id="item-{index}">'
        f'<div class="thumb">{picture}</div><div class="body">'
        f'<h2 class="id">{escape(str(row.get("id")))}</h2>'
        f'<p class="source">{escape(_source(row))}</p>{_span(row)}'
        f'<p class="prompt">{escape(str(row.get("prompt") or ""))}</p>'
        f'{outcome}<p class="meta">{escape(tokens)}</p>{more}</div></article>'
    )


def _span(row: Mapping[str, Any]) -> str:
    """The part of its video or audio a row is about (a clip, a window): where it starts and
    ends, and how long it is; nothing for a row about a whole file."""
    start, end = row.get("start"), row.get("end")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return ""
    span = f"{_seconds(start)} to {_seconds(end)} s ({_seconds(end - start)} s long)"
    return f'<p class="span">{escape(span)}</p>'


def _seconds(value: float) -> str:
    """Seconds to the millisecond, without trailing zeros (``12.5``, ``3``)."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _answer(name: str, answer: Any) -> str:
    """One answer of a multi-output row: its text (or parsed JSON), or its error."""
    answer = answer if isinstance(answer, Mapping) else {"text": answer}
    if answer.get("error"):
        stage, message = _error_parts(answer["error"])
        body = f'<span class="stage">{escape(stage)}</span> {escape(message)}'
        return f'<p class="error"><b>{escape(name)}</b> {body}</p>'
    value = answer.get("parsed")
    text = json.dumps(value, ensure_ascii=False) if value is not None else answer.get("text")
    return f'<p class="text"><b>{escape(name)}</b> {escape(str(text or ""))}</p>'


def _error_parts(error: Any) -> tuple[str, str]:
    """Rows carry errors as ``{stage, message}`` (the command) or ``"stage: message"``
    (a ``DatasetMap`` column)."""
    if isinstance(error, Mapping):
        return str(error.get("stage", "")), str(error.get("message", ""))
    stage, sep, message = str(error).partition(": ")
    return (stage, message) if sep else ("", str(error))


def _source(row: Mapping[str, Any]) -> str:
    source = row.get("source")
    return ", ".join(map(str, source)) if isinstance(source, list) else str(source or "")


def _summary(summary: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> str:
    if summary is None:
        failed = sum(1 for row in rows if row.get("error"))
        return (
            f'<p class="counts">{counted(len(rows), "item")}: {len(rows) - failed} ok, '
            f"{failed} failed</p>"
            '<p class="note">No summary file beside the output, so no throughput or cache '
            "figures.</p>"
        )
    stats = summary.get("stats", {})
    job = summary.get("job", {})
    by_stage = stats.get("failed_by_stage") or {}
    failed_detail = (
        " (" + ", ".join(f"{n} at {s}" for s, n in sorted(by_stage.items())) + ")"
        if by_stage
        else ""
    )
    facts = [
        (
            "items",
            f"{stats.get('total', len(rows))}: {stats.get('ok', '?')} ok, "
            f"{stats.get('failed', '?')} failed{failed_detail}",
        ),
        (
            "throughput",
            f"{_number(stats.get('output_tokens_per_second'))} output tok/s, "
            f"{_number(stats.get('items_per_second'))} items/s",
        ),
        (
            "tokens",
            f"{stats.get('prompt_tokens', '?')} prompt ({stats.get('cached_tokens', '?')} "
            f"from prefix cache), {stats.get('output_tokens', '?')} output",
        ),
        (
            "cache hit rates",
            f"prefix {_percent(stats.get('prefix_cache_hit_rate'))}, "
            f"multimodal {_percent(stats.get('mm_cache_hit_rate'))}",
        ),
        ("media", f"{stats.get('decodes', '?')} decoded"),
        ("wall time", _wall_time(stats)),
        ("model", str(job.get("model", "?"))),
        ("finished", str(summary.get("finished_at", "?"))),
    ]
    return (
        "<dl>"
        + "".join(
            f'<dt>{escape(k)}</dt><dd class="{escape(k.replace(" ", "-"))}">{escape(v)}</dd>'
            for k, v in facts
        )
        + "</dl>"
    )


def _wall_time(stats: Mapping[str, Any]) -> str:
    """The whole command's seconds, then its parts (``time_split``); a summary without them
    (written before they were recorded, or by a job that started no engine) says its work's."""
    whole, startup, work = (
        stats.get(name) for name in ("process_seconds", "startup_seconds", "wall_seconds")
    )
    restarts = stats.get("restart_seconds") or 0.0  # none before restarts were counted
    if all(isinstance(part, (int, float)) for part in (whole, startup, work, restarts)):
        split = time_split(whole, startup, work, restarts)
        if split is not None:
            return split.removeprefix("time: ")
    return f"{_number(stats.get('wall_seconds'))} s of work"


def _number(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "n/a"


def _percent(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) else "n/a"


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f4f4f5; color: #18181b; }
header { background: #fff; padding: 12px 20px 0; }
nav { background: #fff; padding: 8px 20px; border-bottom: 1px solid #ddd;
      position: sticky; top: 0; z-index: 1; display: flex; flex-wrap: wrap; gap: 4px 14px;
      align-items: center; }
h1 { font-size: 18px; margin: 0 0 6px; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 12px;
     margin: 6px 0; }
dt { color: #71717a; } dd { margin: 0; }
nav label { cursor: pointer; }
#search { flex: 1 1 12em; max-width: 28em; min-width: 0; font: inherit; padding: 2px 6px; }
#showing { color: #71717a; }
main { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(420px, 100%), 1fr));
       gap: 12px; padding: 16px 20px; }
.item { display: flex; flex-wrap: wrap; gap: 12px; background: #fff;
        border: 1px solid #e4e4e7; border-radius: 6px; padding: 10px; min-width: 0; }
.item.error { border-left: 4px solid #dc2626; }
.item[hidden] { display: none; }
.thumb { flex: 0 1 192px; min-width: 0; }
.thumb img { max-width: 100%; max-height: 192px; display: block; }
.nopreview { width: 180px; max-width: 100%; color: #a1a1aa; font-size: 12px; }
.body { flex: 1 1 180px; min-width: 0; } .body h2 { font-size: 13px; margin: 0; }
.source, .meta, .prompt, .span { color: #71717a; font-size: 12px; margin: 2px 0; }
.text { white-space: pre-wrap; margin: 6px 0; }
p.error { color: #b91c1c; white-space: pre-wrap; margin: 6px 0; }
details pre { white-space: pre-wrap; }
h1, dd, .body, .body * { overflow-wrap: anywhere; word-break: break-word; }
.stage { font-weight: 600; text-transform: uppercase; font-size: 11px; }
"""

_SCRIPT = """
(function () {
  var filters = ["all", "errors", "ok"];
  var items = document.querySelectorAll(".item");
  var search = document.getElementById("search");
  var texts = Array.prototype.map.call(items, function (item) {
    return item.querySelector(".body").textContent.toLowerCase();
  });
  function apply() {
    var name = document.body.dataset.filter;
    var words = search.value.toLowerCase().split(/\\s+/).filter(Boolean);
    var shown = 0;
    items.forEach(function (item, i) {
      var status = name === "all" || (name === "errors") === (item.dataset.status === "error");
      var found = words.every(function (word) { return texts[i].indexOf(word) >= 0; });
      item.hidden = !(status && found);
      if (!item.hidden) { shown++; }
    });
    document.getElementById("showing").textContent =
      "showing " + shown + " of " + items.length;
  }
  function choose(name) {
    if (filters.indexOf(name) < 0) { name = "all"; }
    document.body.dataset.filter = name;
    document.querySelector('input[name="filter"][value="' + name + '"]').checked = true;
    apply();
  }
  document.querySelectorAll('input[name="filter"]').forEach(function (input) {
    input.addEventListener("change", function () {
      history.replaceState(null, "", input.value === "all" ? "#" : "#" + input.value);
      choose(input.value);
    });
  });
  search.addEventListener("input", apply);
  window.addEventListener("hashchange", function () { choose(location.hash.slice(1)); });
  choose(location.hash.slice(1));
})();
"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body data-filter="all">
<header>
<h1>{title}</h1>
<section id="summary">{summary}</section>
</header>
<nav id="filters">
<label><input type="radio" name="filter" value="all" checked> all ({total})</label>
<label><input type="radio" name="filter" value="errors"> errors only ({failed})</label>
<label><input type="radio" name="filter" value="ok"> ok only ({ok})</label>
<input type="search" id="search" placeholder="search answers, ids, errors"
 aria-label="show only the cards whose text holds these words">
<span id="showing"></span>
</nav>
<main id="items">
{cards}
</main>
<script>{script}</script>
</body>
</html>
"""
