"""The chat templates the generated model directories carry, each in its family's own style.

``QWEN_CHAT_TEMPLATE`` serves the Qwen families: it is Qwen2-VL's own template (image and
video parts, ``add_vision_id``) with Qwen2-Audio's audio part added, so a message may hold
parts of type ``image``, ``video``, ``audio`` and ``text`` in any order. A conversation that
does not open with a system message gets the default one, ``You are a helpful assistant.``.

Rendered with ``add_generation_prompt=True``, one user turn with an image and a question reads::

    <|im_start|>system
    You are a helpful assistant.<|im_end|>
    <|im_start|>user
    <|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>
    <|im_start|>assistant

The processors then expand each ``<|image_pad|>`` / ``<|video_pad|>`` / ``<|AUDIO|>`` into as many
copies as the media item needs.

The other families' templates keep their real counterparts' turn markers and media
placeholders (what vLLM's processor for the family looks for) and leave out the rest (tools,
reasoning switches). Each takes message content as a string or as a list of typed parts.
"""

from __future__ import annotations

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
AUDIO_PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"

# Kept on few lines on purpose: every character outside {% %} and {{ }} is output.
QWEN_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    + IMAGE_PLACEHOLDER
    + "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    + VIDEO_PLACEHOLDER
    + "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: " + AUDIO_PLACEHOLDER + "\n"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)


# One message's content, as a string or as typed parts, each part through ``parts``.
def _content(parts: str) -> str:
    return (
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for c in message['content'] %}" + parts + "{% endfor %}{% endif %}"
    )


def _parts(placeholders: dict[str, str]) -> str:
    """``{% if %}`` branches writing each media part's placeholder, and text parts' text."""
    branches = "".join(
        f"{{% {'if' if i == 0 else 'elif'} c['type'] == '{kind}' %}}{text}"
        for i, (kind, text) in enumerate(placeholders.items())
    )
    text = "{% elif c['type'] == 'text' %}" if branches else "{% if c['type'] == 'text' %}"
    return branches + text + "{{ c['text'] }}{% endif %}"


def chatml_template(**placeholders: str) -> str:
    """A ChatML template (``<|im_start|>role ... <|im_end|>``, Qwen2-style text towers) with
    the default system prompt, writing ``placeholders[kind]`` for each media part of that kind
    (``image="<image>\\n"``, as LLaVA-OneVision's template writes it)."""
    return (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\n"
        "{% endif %}"
        "<|im_start|>{{ message['role'] }}\n" + _content(_parts(placeholders)) + "<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# Gemma 3: no system role (its text opens the first user turn), the model answers as "model".
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = (message['content'] if message['content'] is string "
    "else message['content'][0]['text']) + '\n\n' %}"
    "{% else %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    + _content(_parts({"image": "<start_of_image>"}))
    + "<end_of_turn>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Idefics3 / SmolVLM: "User:<image>question<end_of_utterance>" turns after one <|im_start|>.
IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}"
    "{% if message['content'] is not string and message['content'][0]['type'] == 'image' %}:"
    "{% else %}: {% endif %}" + _content(_parts({"image": "<image>"})) + "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

# Mistral 3 (Pixtral vision): [SYSTEM_PROMPT] ... [INST] ... [/INST] answer</s>.
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]"
    + _content(_parts({}))
    + "[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]" + _content(_parts({"image": "[IMG]"})) + "[/INST]"
    "{% else %}" + _content(_parts({})) + "{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
)

__all__ = [
    "AUDIO_PLACEHOLDER",
    "DEFAULT_SYSTEM_PROMPT",
    "GEMMA3_CHAT_TEMPLATE",
    "IDEFICS3_CHAT_TEMPLATE",
    "IMAGE_PLACEHOLDER",
    "MISTRAL3_CHAT_TEMPLATE",
    "QWEN_CHAT_TEMPLATE",
    "VIDEO_PLACEHOLDER",
    "chatml_template",
]
