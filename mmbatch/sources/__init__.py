"""Everything that turns inputs into ``Request``s, reading no media: files and manifests,
media of every kind in one listing, video frames and clips, audio windows, dataset cells,
local datasets, OpenAI batch files."""

DEFAULT_PROMPTS = {
    "image": "Describe this image in one sentence.",
    "video": "Describe this video in one sentence.",
    "audio": "Describe this audio in one sentence.",
    "frame": "Describe this video frame in one sentence.",
}
"""What a job asks of each item when it is given no prompt, by what the item is: a picture,
a video clip (a whole video with ``--as-clip``, or a clip cut from one), an audio window,
or one frame sampled from a video (``mmbatch frames``, clips cut as single frames)."""

DEFAULT_PROMPT = DEFAULT_PROMPTS["image"]
"""What a caption job asks of a picture when it is given no prompt: the notebook's
``caption(prompt=...)`` defaults to it, and a job given no ``--prompt`` records it as its
prompt (``mmbatch caption``'s other media get theirs from ``DEFAULT_PROMPTS``)."""
