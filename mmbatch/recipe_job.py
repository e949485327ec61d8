"""A recipe applied to inputs: the requests, the loader and the row builder of one job.

Each item found in the inputs becomes one request per question of the recipe. The requests
of an item share its media references, sit next to each other (so a window never splits an
item, and the media is read and decoded once), and carry the item's id and the question's
name, from which ``ItemRows`` assembles the item's single row. Their ids are
``ITEM#QUESTION``: unique, since question names cannot hold ``#``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mmbatch.config import AudioOptions, ImageOptions, VideoOptions
from mmbatch.errors import SourceError
from mmbatch.media.fetch import UrlPolicy
from mmbatch.media.loader import MediaLoader
from mmbatch.recipe import Recipe
from mmbatch.rows import ItemRows
from mmbatch.sources import SourcePolicy, image_requests
from mmbatch.types import Modality, Request

if TYPE_CHECKING:
    from mmbatch.budget import PromptBudget


def recipe_requests(
    inputs: Sequence[str], recipe: Recipe, policy: SourcePolicy | None = None
) -> list[Request]:
    """One request per (item, question), items in input order, an item's questions together;
    ``policy`` says what the inputs may point at (see ``mmbatch.sources``).

    An item is what the recipe's [media] kind makes of the inputs: an image, a sampled video
    frame (``as_clip = false``), a whole clip (``as_clip = true``), or an audio window."""
    return item_requests(_items(inputs, recipe, policy), recipe)


def item_requests(items: Sequence[Request], recipe: Recipe) -> list[Request]:
    """The requests of ``items`` already listed (one request each, asking the manifest's
    prompt or the recipe's first question): one per (item, question). The Ray runner calls
    this in its actors, on the items that reach them."""
    first = recipe.questions[0].text
    single = len(recipe.questions) == 1
    requests = []
    for item in items:
        if not single and item.prompt != first:
            raise SourceError(
                f"item {item.id!r} brings its own prompt from its manifest row, which a "
                f"recipe with several questions cannot use; drop the manifest's 'prompt'"
            )
        for question in recipe.questions:
            requests.append(
                Request(
                    id=f"{item.id}#{question.name}",
                    # A single-question recipe lets a manifest row's prompt replace its own.
                    prompt=item.prompt if single else question.text,
                    media=item.media,
                    system=recipe.system,
                    columns=item.columns,
                    item_id=item.id,
                    output=question.name,
                )
            )
    return requests


def _items(inputs: Sequence[str], recipe: Recipe, policy: SourcePolicy | None) -> list[Request]:
    from mmbatch.media_sources import audio_requests, caption_requests, frame_requests

    kind, system, prompt = recipe.media.kind, recipe.system, recipe.questions[0].text
    if kind == "image":
        return image_requests(inputs, prompt, system, policy)
    if kind == "audio":
        return audio_requests(inputs, audio_options(recipe), prompt, system)
    if recipe.media.options.get("as_clip", False):
        clips: tuple[Modality, ...] = ("video",)
        return caption_requests(inputs, prompt, system, take=clips, as_clip=True, policy=policy)
    return frame_requests(inputs, video_options(recipe), prompt, system)


def recipe_loader(
    recipe: Recipe, urls: UrlPolicy | None = None, budget: PromptBudget | None = None
) -> MediaLoader:
    """The loader that decodes the recipe's media with its [media] options (and fetches
    URLs within ``urls``'s limits, when given); ``budget`` (the engine's) lets it measure,
    and shrink within the recipe's bounds, each prompt before it is sent."""
    kind = recipe.media.kind
    return MediaLoader(
        image_options(recipe),
        urls=urls,
        video_options=video_options(recipe) if kind == "video" else None,
        audio_options=audio_options(recipe) if kind == "audio" else None,
        budget=budget,
    )


def image_options(recipe: Recipe) -> ImageOptions:
    """The [media] options that decode pictures (and a video's frames: ``max_pixels``)."""
    options = recipe.media.options
    return ImageOptions(
        **{k: options[k] for k in ("max_pixels", "max_source_pixels") if k in options}
    )


def video_options(recipe: Recipe) -> VideoOptions:
    options = dict(recipe.media.options)
    options.pop("as_clip", None)
    if "timestamps" in options:
        options["timestamps"] = tuple(options["timestamps"])
    return VideoOptions(**options)


def audio_options(recipe: Recipe) -> AudioOptions:
    return AudioOptions(**recipe.media.options)


def recipe_rows(recipe: Recipe, requests: Sequence[Request]) -> ItemRows:
    """The row builder: one row per item, JSON answers parsed and checked against the schema."""
    if recipe.output.schema is None:
        return ItemRows(requests)
    from mmbatch.json_output import JsonParser

    return ItemRows(requests, JsonParser(recipe.output.schema))
