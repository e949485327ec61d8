"""How many prompt tokens vLLM makes of one media item, from vLLM's own per-model processing.

The pre-flight budget (``mmbatch.engine.budget``) needs, before a picture or clip reaches the
engine, the number of tokens it will take. vLLM knows this for every model it serves: each
multimodal model registers a ``BaseProcessingInfo`` whose ``get_num_image_tokens`` /
``get_num_video_tokens`` compute it from the item's size alone. :class:`ProcessingCounts`
reaches that object through vLLM's multimodal registry for the model's config, so a family
vLLM adds is counted without a change here. Beside the adapter (``engine/vllm.py``), this is
the only engine module that imports vllm.

Three things the info's methods do not say are measured once, by running vLLM's own
processor on a blank item inside the model's chat template:

* the tokens around the item: Gemma 3 writes ``\\n\\n<start_of_image>`` ... ``<end_of_image>\\n\\n``
  around its 256 image tokens, InternVL ``<img>`` ... ``</img>``, Qwen3-VL a time stamp for
  each pair of frames, Pixtral a ``[IMG_BREAK]`` for each row, Idefics3 a tag for each tile.
  Measured on pictures of three shapes (clips of two lengths), the extra tokens are exact
  where they are fixed (Qwen, LLaVA-OneVision, Gemma 3, InternVL) or grow with the frames
  (Qwen3-VL); where they grow with the picture's grid (Pixtral, Idefics3) the fewest seen are
  counted, so that the budget never refuses what vLLM would take (the slow tests compare with
  the prompt lengths vLLM reports);
* whether the count is also what the item takes in the encoder cache (vLLM checks items
  against it in embeddings; Pixtral's ``[IMG_BREAK]`` tokens count in the prompt but are no
  embeddings): where the two differ, the budget leaves that check to vLLM;
* audio, whose token count vLLM's audio models derive from the processed features, not from
  an arithmetic rule: each length (in samples) is measured once on silence and remembered.

Where a family's info has no count for a modality (InternVL's video, for one), or asks for
arguments this module cannot supply, the count is unknown (``None``): the budget lets the
request through and vLLM's own checks refuse it if it does not fit, as an error row.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from mmbatch.engine.budget import ItemCount
from mmbatch.types import MODALITIES, Modality

Render = Callable[[str | None, str, tuple[str, ...]], str]
"""The model's chat template: (system, prompt, media kinds in order) -> prompt text."""

SAMPLE_PROMPT = "Describe this."
"""The question in the prompts the wrappers are measured in."""

IMAGE_SAMPLES = ((64, 48), (480, 160), (512, 16))
"""Picture sizes of different shapes, a one-row strip among them: tiling processors cut
them into different grids, and a processor that marks rows or tiles marks fewest there."""
VIDEO_SAMPLE = (64, 48)
VIDEO_FRAMES = (4, 8)
AUDIO_LENGTHS_KEPT = 256
"""Audio lengths whose measured counts are remembered (a job's windows share a few)."""

_FILLED_BY_SIZE = {"image_width", "image_height", "num_frames"}


@dataclass(frozen=True)
class _Wrapper:
    """The tokens an item adds besides its count, as measured: ``base`` plus ``per_frame``
    for each frame; and whether the count is also its encoder output."""

    base: float
    per_frame: float = 0.0
    count_is_encoder: bool = True

    def item(self, count: int, frames: int = 0) -> ItemCount:
        extra = math.floor(self.base + self.per_frame * frames + 1e-9)
        return ItemCount(count + extra, count if self.count_is_encoder else None)


class ProcessingCounts:
    """``mmbatch.engine.budget.TokenCounts`` from vLLM's processing info for ``model_config``.

    ``render`` is the chat template the engine renders prompts with: the wrappers are
    measured in it, since what the processor adds can merge with the text around it (Gemma
    3's newlines). Safe to use from several threads.
    """

    def __init__(self, model_config: Any, render: Render) -> None:
        from vllm.multimodal import MULTIMODAL_REGISTRY

        self._processor: Any = None
        self._info: Any = None  # a text-only model: no media, nothing to count
        if model_config.is_multimodal_model:
            self._processor = MULTIMODAL_REGISTRY.create_processor(model_config)
            self._info = self._processor.info
        self._render = render
        self._lock = threading.Lock()
        self._wrappers: dict[Modality, _Wrapper | None] = {}
        self._audio: OrderedDict[int, ItemCount | None] = OrderedDict()
        self._noted: set[str] = set()
        supported = self._info.supported_mm_limits if self._info is not None else {}
        self.modalities = frozenset(m for m in MODALITIES if m in supported)
        self._image_count = self._counter("get_num_image_tokens", "image")
        self._video_count = self._counter("get_num_video_tokens", "video")

    # ------------------------------------------------------------------ TokenCounts

    def image(self, width: int, height: int) -> ItemCount | None:
        if self._image_count is None:
            self._unknown("image", "vLLM's processing info gives no picture token count")
            return None
        count = self._count(self._image_count, image_width=width, image_height=height)
        wrapper = self._wrapper("image")
        return None if count is None or wrapper is None else wrapper.item(count)

    def video(self, width: int, height: int, frames: int) -> ItemCount | None:
        if self._video_count is None:
            self._unknown("video", "vLLM's processing info gives no clip token count")
            return None
        count = self._count(
            self._video_count, image_width=width, image_height=height, num_frames=frames
        )
        wrapper = self._wrapper("video")
        return None if count is None or wrapper is None else wrapper.item(count, frames)

    def audio(self, samples: int) -> ItemCount | None:
        if "audio" not in self.modalities or samples < 1:
            return None
        with self._lock:
            if samples in self._audio:
                self._audio.move_to_end(samples)
                return self._audio[samples]
        import numpy as np

        rate = self.audio_rate or 16_000
        try:
            count: ItemCount | None = ItemCount(
                *self._measure("audio", (np.zeros(samples, dtype=np.float32), rate))
            )
        except Exception as exc:  # this length, refused: vLLM will refuse it too
            self._unknown("audio", f"vLLM's processor refused {samples} samples of silence: {exc}")
            count = None
        with self._lock:
            self._audio[samples] = count
            while len(self._audio) > AUDIO_LENGTHS_KEPT:
                self._audio.popitem(last=False)
        return count

    def largest_image(self) -> tuple[int, int] | None:
        """The picture size with the most tokens, as vLLM profiles the model with it."""
        method = getattr(self._info, "get_image_size_with_most_features", None)
        if method is None:
            return None
        try:
            size = method()
        except Exception:  # a family whose method needs arguments, or fails without them
            return None
        return int(size.width), int(size.height)

    @cached_property
    def audio_rate(self) -> int | None:
        """The rate the model's audio features expect (blank audio is measured at it)."""
        features = getattr(self._info.get_hf_processor(), "feature_extractor", None)
        rate = getattr(features, "sampling_rate", None)
        return int(rate) if rate else None

    # ------------------------------------------------------------------ the info's counts

    def _counter(self, name: str, modality: Modality) -> Callable[..., int] | None:
        """The info's ``name`` with every argument but the size filled, or None where the
        family has no such method or it asks for something unknown here."""
        method = getattr(self._info, name, None)
        if method is None or modality not in self.modalities:
            return None
        fixed: dict[str, Any] = {}
        for param in inspect.signature(method).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if param.name in _FILLED_BY_SIZE:
                continue
            value = self._argument(param.name, modality)
            if value is not None:
                fixed[param.name] = value
            elif param.default is param.empty:
                return None

        def count(**size: int) -> int:
            return int(method(**fixed, **size))

        return count

    def _argument(self, name: str, modality: Modality) -> Any:
        """What vLLM's own callers pass for ``name``: the HF processor, the processor of
        the item's kind, or no per-request processor settings."""
        info = self._info
        if name in ("mm_kwargs", "hf_processor_mm_kwargs"):
            return {}
        if name in ("processor", "hf_processor"):
            return info.get_hf_processor()
        if name in ("image_processor", "video_processor"):
            hf = info.get_hf_processor()
            if modality == "video":
                if hasattr(info, "get_video_processor"):
                    return info.get_video_processor()
                video = getattr(hf, "video_processor", None)
                if video is not None:
                    return video
            if hasattr(info, "get_image_processor"):
                return info.get_image_processor()
            return getattr(hf, "image_processor", None)
        return None

    @staticmethod
    def _count(counter: Callable[..., int], **size: int) -> int | None:
        """The count, or None where the info cannot give one for this size. A ValueError is
        the processor's own refusal of the size (Qwen's resize refuses an aspect ratio over
        200, as vLLM's processor will): it reaches the budget, which refuses the item."""
        try:
            return counter(**size)
        except ValueError:
            raise
        except Exception:
            return None

    # ------------------------------------------------------------------ measured wrappers

    def _wrapper(self, modality: Modality) -> _Wrapper | None:
        with self._lock:
            if modality not in self._wrappers:
                self._wrappers[modality] = self._calibrate(modality)
            return self._wrappers[modality]

    def _calibrate(self, modality: Modality) -> _Wrapper | None:
        """The extra tokens around an item, from vLLM's processor on blank items: the same
        at every sample, they are that many; growing with a clip's frames, so many a frame;
        otherwise the fewest seen (an item then counts no more than it takes, and vLLM's own
        check has the last word)."""
        import numpy as np

        points: list[tuple[int, int, int, int]] = []  # (count, frames, tokens, encoder)
        try:
            if modality == "image":
                from PIL import Image

                assert self._image_count is not None
                for width, height in IMAGE_SAMPLES:
                    count = self._image_count(image_width=width, image_height=height)
                    measured = self._measure_locked("image", Image.new("RGB", (width, height)))
                    points.append((count, 0, *measured))
            else:
                assert self._video_count is not None
                width, height = VIDEO_SAMPLE
                for frames in VIDEO_FRAMES:
                    count = self._video_count(
                        image_width=width, image_height=height, num_frames=frames
                    )
                    clip = np.zeros((frames, height, width, 3), dtype=np.uint8)
                    measured = self._measure_locked("video", (clip, _clip_metadata(frames)))
                    points.append((count, frames, *measured))
        except Exception as exc:  # the family's processor cannot take a blank item: unknown
            self._unknown(modality, f"measuring a blank {modality} failed: {exc}")
            return None
        extras = [tokens - count for count, _, tokens, _ in points]
        encoder = all(enc == count for count, _, _, enc in points)
        if len(set(extras)) == 1:
            return _Wrapper(extras[0], count_is_encoder=encoder)
        (_, f1, _, _), (_, f2, _, _) = points[0], points[-1]
        if modality == "video" and extras[-1] > extras[0]:
            slope = (extras[-1] - extras[0]) / (f2 - f1)
            return _Wrapper(extras[0] - slope * f1, per_frame=slope, count_is_encoder=encoder)
        return _Wrapper(min(extras), count_is_encoder=encoder)

    def _measure(self, modality: Modality, item: Any) -> tuple[int, int]:
        with self._lock:
            return self._measure_locked(modality, item)

    def _measure_locked(self, modality: Modality, item: Any) -> tuple[int, int]:
        """(prompt tokens the item adds, its encoder outputs), from vLLM's processor on a
        one-item prompt of the chat template; the item's placeholder token, which the
        budget's text count leaves out, is not counted. Raises what vLLM raises."""
        info = self._info
        tokenizer = info.get_tokenizer()
        text = self._render(None, SAMPLE_PROMPT, (modality,))
        ids = tokenizer.encode(text, **info.default_tok_params.get_encode_kwargs())
        items = info.parse_mm_data({modality: [item]}, validate=False)
        out = self._processor(ids, items, hf_processor_mm_kwargs={})
        placeholders = out["mm_placeholders"].get(modality, [])
        encoder = sum(int(p.get_num_embeds()) for p in placeholders)
        return len(out["prompt_token_ids"]) - len(ids) + 1, encoder

    def _unknown(self, modality: Modality, why: str) -> None:
        """Say once that ``modality``'s counts are not known, and why: the budget then lets
        those items through, and vLLM's own checks decide."""
        if modality in self._noted or modality not in self.modalities:
            return
        self._noted.add(modality)
        print(
            f"mmbatch: {modality} token counts are not known before vLLM processes them "
            f"({why}); prompts too long for the model are refused by vLLM, as error rows",
            file=sys.stderr,
        )


def _clip_metadata(frames: int) -> dict[str, Any]:
    """Metadata as the loader sends it with a clip (``mmbatch.media.video.clip_from``)."""
    return {
        "total_num_frames": frames,
        "fps": 2.0,
        "duration": frames / 2.0,
        "frames_indices": list(range(frames)),
        "video_backend": "opencv",
        "do_sample_frames": False,
    }
