"""`headstart serve`: an OpenAI-compatible HTTP server over the continuous speculative engine.

protocol.py  the API's request models: what is read, ignored (unknown fields) or refused
bodies.py    response bodies, stream chunks, OpenAI error bodies (Refused)
chat.py      a chat's prompt: messages and tools through the target's chat template
replies.py   one request's choices through the decode loop, answered whole or streamed
logprobs.py  logprobs and echo: one scoring forward of the target over the finished sequence
tokens.py    vLLM's /tokenize, /detokenize, /tokenizer_info (lm-evaluation-harness uses them)
text.py      token ids to the text a client receives (incremental, stop strings cut)
scheduler.py the decode loop's worker thread: lanes of continuous engines, limits, shutdown
metrics.py   /metrics in Prometheus' text format
served.py    what the handlers share
app.py       the FastAPI routes, middleware (key, Content-Type, CORS) and error handlers

FastAPI and uvicorn (the optional `serve` extra, what vLLM serves with): pydantic validates each
request against its model (a wrong type is a 400 that names the field),
server-sent events and client disconnects come with Starlette, and uvicorn's graceful shutdown
lets running requests finish on SIGTERM.
"""
