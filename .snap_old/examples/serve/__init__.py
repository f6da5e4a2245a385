"""Streaming TTS service on the ttsaot runtime: `python -m examples.serve --artifacts artifacts --port 8000`.

app.py (Starlette app + Service), metrics.py (Prometheus), load.py (load generator), ray_app.py (Ray Serve).
Nothing is imported here: `__main__` must set the OpenMP wait policy before torch loads."""
