"""A recipe applied to inputs: the requests, the loader and the row builder of one job.

Each item found in the inputs becomes one request per question of the recipe. The requests
of an item share its media references, sit next to each other (so a window never splits an
item, and the media is read and decoded once), and carry the item's id and the question's
name, from which ``ItemRows`` assembles the item's single row. Their ids are
``ITEM#QUESTION``: unique, since question names cannot hold ``#``.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmbatch.config import ImageOptions
from mmbatch.errors import ConfigError, SourceError
from mmbatch.media.fetch import UrlPolicy
from mmbatch.media.loader import MediaLoader
from mmbatch.recipe import Recipe
from mmbatch.rows import ItemRows
from mmbatch.sources import SourcePolicy, image_requests
from mmbatch.types import Request


def recipe_requests(
    inputs: Sequence[str], recipe: Recipe, policy: SourcePolicy | None = None
) -> list[Request]:
    """One request per (item, question), items in input order, an item's questions together;
    ``policy`` says what the inputs may point at (see ``mmbatch.sources``)."""
    require_loader(recipe)
    items = image_requests(inputs, recipe.questions[0].text, recipe.system, policy)
    return item_requests(items, recipe)


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
                    item_id=item.id,
                    output=question.name,
                )
            )
    return requests


def recipe_loader(recipe: Recipe, urls: UrlPolicy | None = None) -> MediaLoader:
    """The loader that decodes the recipe's media with its [media] options (and fetches
    URLs within ``urls``'s limits, when given)."""
    require_loader(recipe)
    return MediaLoader(ImageOptions(**recipe.media.options), urls=urls)


def recipe_rows(recipe: Recipe, requests: Sequence[Request]) -> ItemRows:
    """The row builder: one row per item, JSON answers parsed and checked against the schema."""
    if recipe.output.schema is None:
        return ItemRows(requests)
    from mmbatch.json_output import JsonParser

    return ItemRows(requests, JsonParser(recipe.output.schema))


def require_loader(recipe: Recipe) -> None:
    """Refuse, before any work, a recipe whose kind of media this build cannot load."""
    if recipe.media.kind != "image":
        raise ConfigError(
            f"recipe {recipe.name!r} reads {recipe.media.kind}, and the {recipe.media.kind} "
            f"loader (issue 3) is not in this build yet: `mmbatch check` validates the recipe, "
            f"`mmbatch run` cannot run it"
        )
