"""Everything that turns inputs into ``Request``s, reading no media: files and manifests,
media of every kind in one listing, video frames and clips, audio windows, dataset cells,
local datasets, OpenAI batch files."""

DEFAULT_PROMPT = "Describe this image in one sentence."
"""What a caption job asks of each item when it is given no prompt: ``mmbatch caption``'s
``--prompt`` and the notebook's ``caption(prompt=...)`` default to it."""
