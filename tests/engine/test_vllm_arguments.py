"""The argument names read from vLLM's source (for a recipe's messages, without importing
vLLM) are exactly the ones ``vllm.LLM`` takes."""

from __future__ import annotations

import dataclasses

from mmbatch.engine.vllm_arguments import LLM_ONLY_ARGUMENTS, engine_argument_names


def test_the_names_read_from_vllms_source_are_its_engine_arguments() -> None:
    from vllm.engine.arg_utils import EngineArgs

    names = engine_argument_names()
    assert names == {f.name for f in dataclasses.fields(EngineArgs)} | LLM_ONLY_ARGUMENTS
    assert {"max_num_seqs", "download_dir", "chat_template"} <= names
