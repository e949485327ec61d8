"""``mmbatch report OUT --html report.html``: the review gallery of a finished job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.cli.options import EXIT_OK, Commands

if TYPE_CHECKING:
    from mmbatch.types import FrameAt, MediaRef

DEFAULT_MAX_ITEMS = 2000


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "report",
        help="write a self-contained HTML gallery of a job's output",
        description="Write one HTML page showing each item of OUT (JSONL, Parquet or a "
        "datasets folder) with its thumbnail and its text or error, the job summary from "
        "OUT.summary.json, and a filter for errors.",
    )
    parser.add_argument("out", metavar="OUT", help="the output of a job")
    parser.add_argument("--html", required=True, help="the page to write")
    parser.add_argument(
        "--max-items",
        type=int,
        default=DEFAULT_MAX_ITEMS,
        help="cards on the page: every error, then ok items up to this many in all",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.errors import ConfigError
    from mmbatch.jsonl import printable
    from mmbatch.output.formats import read_output
    from mmbatch.output.paths import OutputPaths
    from mmbatch.output.summary import read_summary
    from mmbatch.output.target import in_store
    from mmbatch.review.gallery import render
    from mmbatch.review.views import card_rows, job_folder

    if in_store(args.out):
        raise ConfigError(
            f"{args.out}: mmbatch report reads an output on this machine's disk; copy it "
            "and its OUT.summary.json down first"
        )
    summary = read_summary(OutputPaths(Path(args.out)))
    rows, media = card_rows(list(read_output(args.out)), summary)
    shown = _select(rows, args.max_items)
    # Relative sources: where the job ran, else beside the output, else here.
    folders = [f for f in (job_folder(summary), Path(args.out).resolve().parent) if f]
    preview = _previews(summary, media, [*folders, Path.cwd()])
    page = render(shown, summary, preview, title=f"mmbatch report: {args.out}")
    target = Path(args.html)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(printable(page), encoding="utf-8")  # file names may not be UTF-8
    left_out = len(rows) - len(shown)
    print(
        f"wrote {target}: {len(shown)} items"
        + (f" ({left_out} ok items left out, see --max-items)" if left_out else ""),
        file=sys.stderr,
    )
    return EXIT_OK


def _select(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Every error row, then ok rows in order, up to ``limit``; the output's order kept."""
    errors = sum(1 for row in rows if row.get("error"))
    ok_room = max(0, limit - errors)
    shown = []
    for row in rows:
        if row.get("error"):
            shown.append(row)
        elif ok_room > 0:
            shown.append(row)
            ok_room -= 1
    return shown


def _previews(
    summary: Mapping[str, Any] | None, known: Mapping[str, MediaRef | str], folders: list[Path]
) -> Callable[[Mapping[str, Any]], str]:
    """``preview(row)``: from the media ``known`` by the row's id (or why it has none), from
    the file the row names (a relative one under the first of ``folders`` that holds it), or,
    for a job that read a local dataset, from the dataset's row (reopened the way the job
    read it)."""
    from mmbatch.review.thumbnails import NoPreview, thumbnail_uri
    from mmbatch.review.views import located
    from mmbatch.sources.mixed_media import modality_of
    from mmbatch.types import MediaRef, TimeSpan

    dataset = (summary or {}).get("job", {}).get("dataset")
    media: Mapping[str, MediaRef | str] = known
    if dataset:
        from mmbatch.errors import SourceError
        from mmbatch.sources.local_datasets import DatasetInput, media_by_id

        try:
            media = media_by_id(DatasetInput(**dataset))
        except (SourceError, TypeError) as exc:
            print(f"mmbatch: no previews from {dataset.get('path')}: {exc}", file=sys.stderr)

    def preview(row: Mapping[str, Any]) -> str:
        error = row.get("error")
        if isinstance(error, Mapping) and error.get("kind") == "not_allowed":
            raise NoPreview("its path leads outside where its input may point")
        ref = media.get(str(row.get("id")))
        if isinstance(ref, str):  # why the row's media are not shown
            raise NoPreview(ref)
        if ref is None:
            source = row.get("source")
            source = source[0] if isinstance(source, list) and source else source
            if not isinstance(source, str) or not source:
                raise NoPreview("the row names no source")
            source = located(source, folders)
            if row.get("frame_index") is not None and row.get("pts") is not None:
                ref = MediaRef("image", source, part=_frame(row))  # a frame job's row
            elif modality_of(source) == "video" and _numbers(row.get("start"), row.get("end")):
                span = TimeSpan(float(row["start"]), float(row["end"]))  # a clip cut from it
                ref = MediaRef("video", source, part=span)
            else:
                ref = MediaRef(modality_of(source), source)
        return thumbnail_uri(ref)

    return preview


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _frame(row: Mapping[str, Any]) -> FrameAt:
    """The frame a frame job's row names; ``NoPreview`` if its fields do not name one."""
    from mmbatch.review.thumbnails import NoPreview
    from mmbatch.types import FrameAt

    index, pts = row["frame_index"], row["pts"]
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise NoPreview(f"frame_index {index!r} is not a frame number")
    if not isinstance(pts, (int, float)) or isinstance(pts, bool):
        raise NoPreview(f"pts {pts!r} is not a time in seconds")
    return FrameAt(index, float(pts))
