"""Where a video's scenes change, found by FFmpeg's own scene score, run through PyAV.

FFmpeg's ``select`` filter scores each frame against the one before it (``scene``, from 0
to 1: the mean absolute difference of their pixels, less the part of it the frame before
already had, so that steady motion scores low and a cut high) and passes the frames whose
score is above a threshold: ``ffmpeg -vf "select='gt(scene,0.3)'"``, what video2dataset's
users and FFmpeg's documentation cut scenes with. Here every frame is decoded and pushed
through ``buffer -> select -> buffersink``; the frames that come out are the cuts. That is
FFmpeg's maintained detector, with nothing to install beside PyAV (PySceneDetect would
decode with OpenCV, a second video stack, for a score of its own).

A scene's score needs every frame decoded, unlike sampling (``mmbatch.media.video``), so
this reads the whole video once.
"""

from __future__ import annotations

from fractions import Fraction

from mmbatch.errors import MediaError
from mmbatch.media.container import av_errors, av_reason, open_media, threaded
from mmbatch.media.video import VideoIndex

DEFAULT_SCENE_THRESHOLD = 0.3
"""FFmpeg's scene score above which a frame starts a new scene (a flat colour to another
scores 0.4 to 1; a camera panning, under 0.1)."""
DEFAULT_MIN_SCENE_SECONDS = 0.5
"""A cut this soon after the last one is ignored (PySceneDetect's ``min_scene_len``, 15
frames at 30 fps): a flash or a fade would otherwise make scenes of a frame or two."""


def scene_cuts(
    path: str,
    index: VideoIndex,
    threshold: float = DEFAULT_SCENE_THRESHOLD,
    min_seconds: float = DEFAULT_MIN_SCENE_SECONDS,
) -> list[int]:
    """The indices (into ``index``, the video's) of the frames that start a new scene:
    those FFmpeg's ``select`` passes at ``gt(scene, threshold)``, less any within
    ``min_seconds`` of the cut before (or of the first frame). Ascending; the first frame
    is never one. A video whose data is damaged part-way is cut where its frames could be
    decoded."""
    import av

    position = {pts: i for i, pts in enumerate(index.pts)}
    found: list[int] = []
    with open_media(path, index.pinned) as container:
        if not container.streams.video:
            raise MediaError("no video stream", kind="unsupported")
        stream = threaded(container.streams.video[0])
        graph = av.filter.Graph()
        source = graph.add_buffer(template=stream)
        select = graph.add("select", f"gt(scene,{threshold!r})")
        sink = graph.add("buffersink")
        source.link_to(select)
        select.link_to(sink)
        graph.configure()

        def drain() -> None:
            while True:
                try:
                    frame = graph.pull()
                except (av.error.BlockingIOError, av.error.EOFError):
                    return
                if frame.pts in position:
                    found.append(position[frame.pts])

        decoded = 0
        try:
            for frame in container.decode(stream):
                decoded += 1
                if frame.pts is None:
                    continue  # no time to place it by: never a frame of the index
                graph.push(frame)
                drain()
            graph.push(None)
            drain()
        except av_errors() as exc:
            if not decoded:
                raise MediaError(f"cannot decode the video: {av_reason(exc)}") from None
            # Damaged data part-way: the cuts before it stand.
    return _spaced(sorted(set(found) - {0}), index, min_seconds)


def _spaced(cuts: list[int], index: VideoIndex, min_seconds: float) -> list[int]:
    """``cuts`` less those within ``min_seconds`` of the cut kept before them, or of the
    first frame (exact: frame times are compared in the stream's own units)."""
    gap = Fraction(str(min_seconds)) / index.time_base
    kept: list[int] = []
    last = index.pts[0]
    for cut in cuts:
        if index.pts[cut] - last >= gap:
            kept.append(cut)
            last = index.pts[cut]
    return kept
