"""The vLLM adapter: the engine's one module that imports vllm's engine. Beside it,
``engine/vllm_settings.py`` says what the engine starts with and checks those settings as
vLLM reads them before any engine starts, ``engine/vllm_counts.py`` reads vLLM's per-model
processing info (the budget's token counts), ``openai_batch/vllm_protocol.py`` imports
vLLM's models of chat completions alone (the OpenAI batch format), and the benchmark
(``mmbatch/bench``) records vLLM's version and, for its naive sides, builds ``vllm.LLM``
itself, as a user's script would. Each imports vllm when first used, never at its own
import.

It drives vLLM's offline engine through its request-level API (``LLMEngine.add_request`` and
``step``) rather than one blocking ``LLM.generate`` call, for three reasons:

* a request that vLLM refuses (too long, media its processor rejects) fails alone in
  ``add_request``, where ``generate`` would abort the whole call;
* the pipeline tops the engine up as its media are decoded, while it runs what it has;
* outputs come back keyed by request id as they finish, never by position.

Each request carries our content keys as ``multi_modal_uuids``, so vLLM's processor and
encoder caches recognise repeated media without hashing pixels again. Prompts are rendered
with the model's own chat template, media placed before the text so that requests sharing
an image share the prefix that the prefix cache can reuse.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from mmbatch.clock import milestone
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.core_process import core_in_this_process
from mmbatch.engine.processor import TemplateLoad
from mmbatch.engine.torch_threads import one_thread_for_engine_processes
from mmbatch.engine.vllm_settings import engine_settings
from mmbatch.errors import FatalEngineError, RequestRejected
from mmbatch.lifetime import KeptPerProcess
from mmbatch.types import (
    CacheStats,
    Choice,
    LoadedRequest,
    MediaItem,
    Modality,
    Restarts,
    Result,
    Sampling,
    TokenLogprob,
    Usage,
)

if TYPE_CHECKING:
    from vllm import LLM, SamplingParams

    from mmbatch.engine.budget import PromptBudget
    from mmbatch.engine.vllm_counts import ProcessingCounts

PROMPT_TOKENS_GUESS = 256
"""The prompt length assumed until the first requests finish (an image and a question)."""
ENGINE_STOP_SECONDS = 20.0
"""How long vLLM's engine-core process may take to stop before it is killed. vLLM's own 5 s
is too short: the engine core first waits for its workers to exit (Python's teardown of
torch and vLLM: 3-8 s on a busy 2-core host), and only then unlinks the shared memory it
made; killed before that, it leaves the segment to multiprocessing's resource tracker, which
warns of it on the user's terminal as the job exits."""


@dataclass
class _Rendering:
    engine_id: str
    request_id: str
    future: Future[Any]
    params: Any
    prompt: dict[str, Any]
    wanted: bool = True
    """False once aborted: rendered all the same, then handed to vLLM and aborted there
    (``VLLMEngine`` says why)."""


_METRICS = {
    "vllm:prefix_cache_queries": "prefix_queries",
    "vllm:prefix_cache_hits": "prefix_hits",
    "vllm:mm_cache_queries": "mm_queries",
    "vllm:mm_cache_hits": "mm_hits",
}


class VLLMEngine:
    """An ``Engine`` over ``vllm.LLM``, built once and fed request by request.

    ``config.render_threads`` moves vLLM's host-side preprocessing (tokenising, the HF image
    processor) off the thread that drives the engine, so it overlaps the GPU instead of
    stalling it: 0 renders inside ``add``; 1 renders in one background thread, keeping
    vLLM's multimodal processor cache (which is not thread-safe); more threads render in
    parallel with that cache off (repeated media are then re-processed on the host, but
    the engine's encoder cache still reuses their encoder outputs by our keys).

    That cache is two mirrored halves: the front end's (which renders) records an item as
    sent when it renders a request carrying it, and from then on sends only its key; the
    engine core's holds the data. They agree only if every request rendered reaches the
    core, in the order rendered. So a request aborted while it renders, or rendered and
    waiting, is not dropped: it is handed to vLLM in its turn and aborted there at once;
    and a request vLLM refuses after rendering hands its media to the core in a stand-in
    (``_mirror_refused``). Dropped, the next request carrying the same media (a job
    resumed on a kept engine, a second prompt about the same picture) would send only the
    key, and vLLM would refuse it for a cache miss.
    """

    def __init__(
        self,
        config: EngineConfig,
        media_per_prompt: dict[Modality, int],
    ) -> None:
        from vllm import LLM

        milestone("vllm_imported")
        settings = engine_settings(config, media_per_prompt)
        render_threads = settings.render_threads
        self.config = config
        self.render_threads = render_threads
        # The chat template loads while vLLM builds the engine, not after it.
        trust = bool(settings.llm_kwargs.get("trust_remote_code", False))
        template = TemplateLoad(config.model, trust)
        on_cpu = settings.on_cpu
        with one_thread_for_engine_processes(on_gpu=not on_cpu), core_in_this_process(on_cpu):
            self.llm: LLM = LLM(**settings.llm_kwargs)
        milestone("llm_built")
        self._engine = self.llm.llm_engine
        if _core_in_process(self._engine):
            with _IN_PROCESS.locked() as engines:
                engines.add(self)
        self._template = template.template()
        self._tokenizer = self.llm.get_tokenizer()  # for a log probability's token vLLM left
        # Read in the start, not at the first request: what loading the model's
        # generation_config logs goes to the engine's log with the start's (start_engine).
        _ = self.model_sampling
        self._ids = itertools.count()
        self._prompt_tokens = [0, 0]  # finished requests' prompt tokens, and their count
        self._rendering: deque[_Rendering] = deque()
        self._pending: dict[str, str] = {}  # engine request id -> our request id
        self._pool = (
            ThreadPoolExecutor(render_threads, thread_name_prefix="mmbatch-render")
            if render_threads
            else None
        )

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        self._check_open()
        prompt = self._prompt(request, media)
        params = _sampling_params(sampling, self.model_sampling)
        engine_id = str(next(self._ids))
        if self._pool is None:
            self._submit(engine_id, request.id, self._render(prompt), params)
        else:
            future = self._pool.submit(self._render, prompt)
            self._rendering.append(_Rendering(engine_id, request.id, future, params, prompt))

    def step(self) -> list[Result]:
        # Hand finished renders to the engine in the order they were added; wait for one
        # only when the engine has nothing else to do.
        failures = self._submit_rendered(wait=not self._pending)
        if not self._pending:
            return failures
        try:
            outputs = self._engine.step()
        except Exception as exc:
            raise FatalEngineError(f"the vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        results = failures
        for output in outputs:
            if not output.finished:
                continue
            request_id = self._pending.pop(output.request_id)
            result = _result(request_id, output, self._tokenizer)
            if result.ok:
                self._prompt_tokens[0] += result.usage.prompt_tokens
                self._prompt_tokens[1] += 1
            results.append(result)
        if self._pending and not self._engine.has_unfinished_requests():
            # vLLM holds nothing more, yet these never came back: without this, the pipeline
            # would wait for them forever.
            for request_id in self._pending.values():
                results.append(
                    Result.failure(
                        request_id, "engine", "vLLM dropped the request without an output", "engine"
                    )
                )
            self._pending.clear()
        return results

    def _render(self, prompt: dict[str, Any]) -> Any:
        """vLLM's own preprocessing of one prompt (tokens, processed media): the host work."""
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        try:
            parsed = parse_model_prompt(self._engine.model_config, prompt)
            (engine_input,) = self._engine.renderer.render_cmpl([parsed])
        except Exception as exc:  # the HF processor raises anything for bad media
            raise _rejected(exc) from exc
        return engine_input

    def _submit(
        self, engine_id: str, request_id: str, engine_input: Any, params: Any, wanted: bool = True
    ) -> None:
        """Hand a rendered request to vLLM; one no longer ``wanted`` (aborted while it
        rendered) is aborted there at once, having kept the media caches mirrored."""
        try:
            _add_request(self._engine, engine_id, engine_input, params)
        except RequestRejected:
            self._mirror_refused(engine_id, engine_input)
            raise
        if wanted:
            self._pending[engine_id] = request_id
        else:
            self._engine.abort_request([engine_id])

    def _mirror_refused(self, engine_id: str, engine_input: Any) -> None:
        """Keep the multimodal processor cache's halves mirrored after vLLM refused a
        rendered request (its settings, its length): the front end recorded its media as
        sent, so the core must get them. A stand-in of the same rendered input with plain
        settings takes them there, aborted at once. Refused too (the input itself is what
        vLLM refuses), both halves start empty again: the renders waiting behind it, which
        counted on the refused request's media, are rendered again after."""
        if self._engine.renderer.mm_processor_cache is None or not _carries_media(engine_input):
            return
        from vllm import SamplingParams

        try:
            _add_request(self._engine, engine_id, engine_input, SamplingParams(max_tokens=1))
        except RequestRejected:
            waiting = list(self._rendering)
            for item in waiting:  # the render thread idle: the cache is not thread-safe
                item.future.exception()
            self._engine.reset_mm_cache()
            if self._pool is not None:
                for item in waiting:
                    item.future = self._pool.submit(self._render, item.prompt)
            return
        self._engine.abort_request([engine_id])

    def _submit_rendered(self, wait: bool) -> list[Result]:
        failures = []
        while self._rendering and (wait or self._rendering[0].future.done()):
            wait = False
            item = self._rendering.popleft()
            try:
                engine_input = item.future.result()
                self._submit(
                    item.engine_id, item.request_id, engine_input, item.params, item.wanted
                )
            except RequestRejected as exc:
                if item.wanted:
                    failures.append(Result.failure(item.request_id, exc.stage, str(exc), exc.kind))
        return failures

    def num_unfinished(self) -> int:
        """The requests not yet answered; not those aborted while they rendered, which
        vLLM is handed (and aborted there) in a later ``step``."""
        return sum(r.wanted for r in self._rendering) + len(self._pending)

    def abort(self, request_ids: Sequence[str]) -> None:
        dropped = set(request_ids)
        for rendering in self._rendering:
            if rendering.request_id in dropped:
                rendering.wanted = False  # still rendered and handed over: see the class
        engine_ids = [e for e, ours in self._pending.items() if ours in dropped]
        for engine_id in engine_ids:
            del self._pending[engine_id]
        if engine_ids:
            self._engine.abort_request(engine_ids)

    def capacity(self) -> int:
        """Twice ``max_num_seqs`` (and at least that plus a prefill's worth of the prompts
        seen so far): requests of equal length finish together, a whole batch at one step,
        and rendering their successors (the HF processor, milliseconds each on one thread)
        takes seconds; those must be rendered and waiting by then, as a prebuilt
        ``LLM.generate`` has them, or the engine runs near empty meanwhile (as it did on a GPU
        with only max_num_seqs plus one prefill handed over)."""
        scheduler = self._engine.vllm_config.scheduler_config
        total, count = self._prompt_tokens
        mean = total / count if count else PROMPT_TOKENS_GUESS
        prefill = int(scheduler.max_num_batched_tokens // max(1.0, mean))
        running = int(scheduler.max_num_seqs)
        return running + max(running, prefill)

    def queue_depths(self) -> tuple[int, int] | None:
        counts = {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0}
        for metric in self.llm.get_metrics():
            if metric.name in counts:
                counts[metric.name] += int(getattr(metric, "value", 0))
        return counts["vllm:num_requests_running"], counts["vllm:num_requests_waiting"]

    def close(self) -> None:
        """Free what the engine holds: its engine process (or, in-process, its model and KV
        cache) and with it the GPU memory, and its render threads. It takes no requests
        after; closing again does nothing. ``with VLLMEngine(...) as engine:`` closes it on
        the way out."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        for hook in getattr(self, "_close_hooks", ()):
            hook()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._rendering.clear()
        self._pending.clear()
        shutdown = getattr(getattr(self._engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            with _shared_state_kept_for_others(self):
                shutdown(timeout=ENGINE_STOP_SECONDS)
        del self.llm, self._engine
        _free_memory()

    def on_close(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` when the engine closes (what was kept for it goes too: its
        pipeline's decoding workers, its place in ``mmbatch.engine.registry``)."""
        hooks: list[Callable[[], object]] = self.__dict__.setdefault("_close_hooks", [])
        if hook not in hooks:
            hooks.append(hook)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise FatalEngineError("the engine is closed; start another to go on")

    @cached_property
    def model_sampling(self) -> dict[str, Any]:
        """The model's own sampling defaults (its ``generation_config``, or none with the
        engine argument ``generation_config="vllm"``), which vLLM itself applies only in
        ``LLM.generate`` and its servers: requests added here get them from us."""
        return dict(self._engine.model_config.get_diff_sampling_param())

    def cache_stats(self) -> CacheStats:
        counts = dict.fromkeys(_METRICS.values(), 0)
        for metric in self.llm.get_metrics():
            field = _METRICS.get(metric.name)
            if field is not None:
                counts[field] += int(getattr(metric, "value", 0))
        return CacheStats(**counts)

    def restarts(self) -> Restarts:
        """None: a vLLM engine whose engine core dies is over (``FatalEngineError``); the
        engine processes around it restart it (``mmbatch.engine.replicas``)."""
        return Restarts()

    def prompt_limits(self) -> PromptBudget:
        """The limits and token counts for measuring prompts before they are added: this
        engine's max_model_len and encoder cache, vLLM's counts for its model, its template."""
        return self._template.budget(self.token_counts, *self.context_limits())

    @cached_property
    def token_counts(self) -> ProcessingCounts:
        """How many tokens vLLM makes of a media item on this model (measured once)."""
        from mmbatch.engine.vllm_counts import ProcessingCounts

        return ProcessingCounts(self._engine.model_config, self._template.render)

    def context_limits(self) -> tuple[int, int | None]:
        """This engine's ``max_model_len``, and its encoder cache in tokens (None: unknown)."""
        processor = getattr(self._engine, "input_processor", None)
        cache = getattr(processor, "mm_encoder_cache_size", 0) or None
        return int(self._engine.model_config.max_model_len), cache

    def _prompt(self, request: LoadedRequest, media: Sequence[MediaItem]) -> dict[str, Any]:
        modalities = tuple(item.modality for item in media)
        asked = request.request
        text = self._template.render(asked.system, asked.prompt, modalities, asked.history)
        prompt: dict[str, Any] = {"prompt": text}
        if media:
            data: dict[str, list[Any]] = {}
            uuids: dict[str, list[str]] = {}
            for item in media:
                data.setdefault(item.modality, []).append(item.payload)
                uuids.setdefault(item.modality, []).append(item.key)
            prompt["multi_modal_data"] = data
            prompt["multi_modal_uuids"] = uuids
        return prompt


_IN_PROCESS = KeptPerProcess(weakref.WeakSet[VLLMEngine]())
"""The open engines whose vLLM engine core runs in this process (a ``Dataset.map`` worker's,
under ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): they share vLLM's distributed state there. A
forked child's engines share none with the parent's copies, which are not its to use."""


def _core_in_process(llm_engine: Any) -> bool:
    from vllm.v1.engine.core_client import InprocClient

    return isinstance(getattr(llm_engine, "engine_core", None), InprocClient)


@contextmanager
def _shared_state_kept_for_others(engine: VLLMEngine) -> Iterator[None]:
    """Shut ``engine`` down without the teardown of this process's vLLM distributed state
    while another in-process engine is open: vLLM's in-process engine core ends with
    ``cleanup_dist_env_and_memory``, which destroys the model-parallel groups that every
    in-process engine of the process runs on (a notebook's held engine would fail its next
    step: "pipeline model parallel group is not initialized"). The last one to close tears
    it down, as vLLM does."""
    with _IN_PROCESS.locked() as engines:
        engines.discard(engine)
        import vllm.v1.engine.core as core

        teardown = getattr(core, "cleanup_dist_env_and_memory", None)
        if not engines or teardown is None:
            yield
            return
        core.cleanup_dist_env_and_memory = _free_memory  # what else it does, the groups kept
        try:
            yield
        finally:
            core.cleanup_dist_env_and_memory = teardown


def _free_memory() -> None:
    """Return what a closed engine held: Python's references first, then the CUDA caching
    allocator's blocks (on a GPU host)."""
    import gc

    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _add_request(llm_engine: Any, engine_id: str, engine_input: Any, params: Any) -> None:
    """``LLMEngine.add_request``, its refusal of this prompt a ``RequestRejected``."""
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        llm_engine.add_request(engine_id, engine_input, params)
    except EngineDeadError as exc:
        raise FatalEngineError(f"the vLLM engine died: {exc}") from exc
    except Exception as exc:  # vLLM raises ValueError, TypeError... per prompt
        raise _rejected(exc) from exc


def _carries_media(engine_input: Any) -> bool:
    """Whether a rendered prompt carries media (itself, or its encoder's part)."""
    parts = [engine_input, *(v for v in engine_input.values() if isinstance(v, Mapping))]
    return any("mm_hashes" in part for part in parts)


_FAILED_FINISH_REASONS = frozenset({"abort", "error"})
"""vLLM finish reasons that mean the request produced no usable text."""


def _rejected(exc: Exception) -> RequestRejected:
    """vLLM's refusal of one prompt, with its kind: "does not fit the context" (vLLM says
    so only in words) or any other refusal."""
    message = str(exc).lower()
    too_long = "maximum context length" in message or "max_model_len" in message
    return RequestRejected(
        f"vLLM refused the request: {type(exc).__name__}: {exc}",
        "too_long" if too_long else "rejected",
    )


def _sampling_params(sampling: Sampling, model_defaults: Mapping[str, Any]) -> SamplingParams:
    """vLLM's parameters for ``sampling``: what it sets, over the model's own defaults (its
    ``generation_config``, as vLLM applies them: ``model_defaults``), over vLLM's. Settings
    that vLLM refuses once merged refuse this request alone (``RequestRejected``)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    explicit = sampling.explicit()
    schema = explicit.pop("json_schema", None)
    stop = list(explicit.pop("stop", ()))
    try:
        return SamplingParams(
            **{**model_defaults, **explicit},
            stop=stop or None,
            # A JSON schema is enforced token by token by vLLM's structured-outputs backend
            # (xgrammar or guidance, chosen by vLLM; both run on the CPU build).
            structured_outputs=StructuredOutputsParams(json=json.loads(schema))
            if schema is not None
            else None,
            # Only the finished output: the pipeline never looks at partial text. vLLM
            # detokenises as it generates (its default), so the text is exactly its own: a
            # cut inside a character is held back, not decoded as U+FFFD, and stop strings
            # are found. It costs about 1.3 us a token in the engine's driving process
            # (a 2-core CPU, vLLM 0.32's CPU build, 2026-12-01; 0.2 us decoding each finished
            # output once).
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
    except (ValueError, TypeError) as exc:  # vLLM's own checks, on the settings merged
        raise RequestRejected(f"vLLM refuses the sampling settings: {exc}") from exc


def _result(request_id: str, output: Any, tokenizer: Any) -> Result:
    """A finished vLLM ``RequestOutput`` as our ``Result``: its completion, or all ``n`` of
    them as ``choices``; a request vLLM failed is an engine error."""
    failed = [c.finish_reason for c in output.outputs if c.finish_reason in _FAILED_FINISH_REASONS]
    if failed or not output.outputs:
        # vLLM fails one request alone this way ("error": a JSON schema whose grammar did
        # not compile, for one; "abort"): its text is empty, never an answer.
        reason = failed[0] if failed else None
        message = f"vLLM failed this request (finish_reason {reason!r}; see its log)"
        return Result.failure(request_id, "engine", message, "engine")
    choices = tuple(
        Choice(
            c.text,
            c.finish_reason,
            len(c.token_ids),
            c.stop_reason,
            None if c.logprobs is None else _token_logprobs(c.token_ids, c.logprobs, tokenizer),
        )
        for c in sorted(output.outputs, key=lambda c: c.index)
    )
    first = choices[0]
    return Result(
        request_id=request_id,
        text=first.text,
        finish_reason=first.finish_reason,
        stop_reason=first.stop_reason,
        logprobs=first.logprobs,
        usage=Usage(
            prompt_tokens=len(output.prompt_token_ids or ()),
            output_tokens=sum(c.output_tokens for c in choices),
            cached_tokens=output.num_cached_tokens or 0,
        ),
        choices=choices if len(choices) > 1 else (),
    )


def _token_logprobs(
    token_ids: Sequence[int], logprobs: Any, tokenizer: Any
) -> tuple[TokenLogprob, ...]:
    """vLLM's ``logprobs`` of a completion (one ``{token id: Logprob}`` per generated token,
    the chosen token first, then the likeliest by rank) as ``TokenLogprob``s. A token is
    its text as vLLM decoded it, else as its OpenAI server decodes it (the token alone); a
    chosen token missing from its step (vLLM always sends it) has no log probability (-inf)
    and no candidates."""
    tokens = []
    for i, token_id in enumerate(token_ids):
        step = logprobs[i] or {}
        candidates = tuple(
            _token_logprob(t, lp.logprob, lp.decoded_token, tokenizer) for t, lp in step.items()
        )
        chosen = step.get(token_id)
        if chosen is None:
            text = tokenizer.decode([token_id])
            tokens.append(TokenLogprob(text, -math.inf, _utf8(text)))
        else:
            found = _token_logprob(token_id, chosen.logprob, chosen.decoded_token, tokenizer)
            tokens.append(dataclasses.replace(found, candidates=candidates))
    return tuple(tokens)


def _token_logprob(
    token_id: int, logprob: float, decoded: str | None, tokenizer: Any
) -> TokenLogprob:
    text = decoded if decoded is not None else tokenizer.decode([token_id])
    return TokenLogprob(text, float(logprob), None if decoded is None else _utf8(decoded))


def _utf8(text: str) -> tuple[int, ...]:
    return tuple(text.encode("utf-8", errors="replace"))
