"""The Qwen chat template every generated model directory carries.

One template serves the three families: it is Qwen2-VL's own template (image and video parts,
``add_vision_id``) with Qwen2-Audio's audio part added, so a message may hold parts of type
``image``, ``video``, ``audio`` and ``text`` in any order. A conversation that does not open with
a system message gets the default one, ``You are a helpful assistant.``.

Rendered with ``add_generation_prompt=True``, one user turn with an image and a question reads::

    <|im_start|>system
    You are a helpful assistant.<|im_end|>
    <|im_start|>user
    <|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>
    <|im_start|>assistant

The processors then expand each ``<|image_pad|>`` / ``<|video_pad|>`` / ``<|AUDIO|>`` into as many
copies as the media item needs.
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

__all__ = [
    "AUDIO_PLACEHOLDER",
    "DEFAULT_SYSTEM_PROMPT",
    "IMAGE_PLACEHOLDER",
    "QWEN_CHAT_TEMPLATE",
    "VIDEO_PLACEHOLDER",
]
