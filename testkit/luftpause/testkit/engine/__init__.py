"""The engine simulator: a continuous-batching inference engine that benchmarks stand on.

Layers, from the bottom:
- pure model (no I/O, no clock reads; time is passed in): `params`, `tokens`, `kvcache`,
  `records`, `sglang`, `core`, `script`, `wire`, `ratelimit` (budgets, fixed windows and
  token buckets), `ratelimit_headers` (OpenAI's and Anthropic's header families), `metrics`;
- shell: `driver` runs the core in real time, `server` answers HTTP (with `replies` writing
  the streams); `main` parses the command line.

Hosted-API mode (`--rpm`, `--tpm`, `--itpm`, `--otpm`, `--rate-limit-regime`,
`--rate-limit-charge`, `--rate-limit-headers`) answers 429 past a budget like OpenAI, Groq or
Anthropic; `GET`/`POST /debug/limits` shows and changes the limits while running.

`luftpause fake-engine --help` lists every parameter; the test kit's README explains the model
and how its defaults were calibrated against llama.cpp.
"""
