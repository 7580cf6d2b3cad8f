"""`headstart serve`: an OpenAI-compatible HTTP server over the continuous speculative engine.

protocol.py  the API's request models, response and chunk bodies, error bodies
text.py      token ids to the text a client receives (incremental, stop strings cut)
scheduler.py the decode loop's worker thread: lanes of continuous engines, limits, shutdown
metrics.py   /metrics in Prometheus' text format
app.py       the FastAPI routes

FastAPI and uvicorn (the optional `serve` extra, what vLLM serves with): pydantic validates each
request against its model (a wrong type or an unknown field is a 400 that names the field),
server-sent events and client disconnects come with Starlette, and uvicorn's graceful shutdown
lets running requests finish on SIGTERM.
"""
