"""The OpenAI batch format, in one place: the files that ``mmbatch run-openai-batch`` reads
and writes, as a hosted batch API or ``vllm run-batch`` does.

* ``reader``: an input file's lines read as requests (``read_batch``), each line's body
  checked as vLLM reads it and its ``response_format`` turned into the job's JSON schema;
* ``writer``: the output lines, the row shape of such a job both ways (``OpenAIBatchShape``:
  written from results, read back for resume, the summary and the gallery);
* ``vllm_protocol``: vLLM's own pydantic models of chat completions, which both sides read
  and write the lines through (vLLM imported on first use, no engine).

A format rather than a stage: it sits above both the sources and the outputs, whose parts it
uses (``sources.paths`` for where a line's pictures may lead, ``output.rows`` for what a row
is, ``output.answers`` for a JSON schema's checks); the command that runs it and the
gallery that shows its lines import it.
"""
