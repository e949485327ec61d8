"""A recipe applied to inputs: the requests, media options and row shape of a job.

Each item found in the inputs becomes one request per question of the recipe. The requests
of an item share its media references, so they are planned together (the media is read and
decoded once), and carry the item's id and the question's name, from which ``ItemRows``
assembles the item's single row. Their ids are ``ITEM#QUESTION``: unique, since question
names cannot hold ``#``.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmbatch.errors import SourceError
from mmbatch.media.fetch import UrlPolicy
from mmbatch.media.options import AudioOptions, ImageOptions, MediaOptions, VideoOptions
from mmbatch.output.rows import ItemShape
from mmbatch.recipe.spec import Recipe
from mmbatch.sources.files import SourcePolicy, image_requests
from mmbatch.sources.log import ListingLog
from mmbatch.sources.mixed_media import Takes, list_media, media_requests
from mmbatch.sources.timeline import audio_requests, clip_cap_note, frame_requests
from mmbatch.types import Modality, Request


def recipe_requests(
    inputs: Sequence[str],
    recipe: Recipe,
    policy: SourcePolicy | None = None,
    log: ListingLog | None = None,
) -> list[Request]:
    """One request per (item, question), items in input order, an item's questions together;
    ``policy`` says what the inputs may point at (see ``mmbatch.sources.files``).

    An item is what the recipe's [media] kind makes of the inputs: an image, a sampled video
    frame (``as_clip = false``), a whole clip (``as_clip = true``), or an audio window.
    What listing passed over or changed goes to ``log``."""
    return item_requests(_items(inputs, recipe, policy, log or ListingLog()), recipe)


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
                    error=item.error,
                )
            )
    return requests


def _items(
    inputs: Sequence[str], recipe: Recipe, policy: SourcePolicy | None, log: ListingLog
) -> list[Request]:
    kind, system, prompt = recipe.media.kind, recipe.system, recipe.questions[0].text
    if kind == "image":
        return image_requests(inputs, prompt, system, policy, log)
    if kind == "audio":
        return audio_requests(inputs, audio_options(recipe), prompt, system, policy, log)
    if recipe.media.options.get("as_clip", False):
        clips: tuple[Modality, ...] = ("video",)
        files = list_media(inputs, policy, log)
        note = clip_cap_note(video_options(recipe))
        if note:
            log.note(note)
        taker = f"the recipe {recipe.name!r} ([media] kind = 'video')"
        takes = Takes(clips, as_clip=True, by=taker)
        return media_requests(files, prompt, system, takes=takes, log=log)
    return frame_requests(inputs, video_options(recipe), prompt, system, policy, log)


def recipe_media(recipe: Recipe, urls: UrlPolicy | None = None) -> MediaOptions:
    """How the recipe's media are decoded (its [media] options), and whether URLs may be
    fetched (within ``urls``'s limits)."""
    kind = recipe.media.kind
    return MediaOptions(
        image=image_options(recipe),
        video=video_options(recipe) if kind == "video" else VideoOptions(),
        audio=audio_options(recipe) if kind == "audio" else AudioOptions(),
        urls=urls,
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


def recipe_shape(recipe: Recipe) -> ItemShape:
    """One row per item; JSON answers parsed and checked against the recipe's schema."""
    if recipe.output.schema is None:
        return ItemShape()
    from mmbatch.output.answers import JsonParser

    return ItemShape(JsonParser(recipe.output.schema))
